/*
 * kcprobe: the probe tests' workload. kcprobe_target takes known
 * arguments on each call (a count down, a string, a small count, a bad
 * pointer) and returns a value the test can compute.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) long kcprobe_target(long a, const char *s, int b, const char *bad)
{
	asm volatile("" ::: "memory");
	return a + (long)strlen(s) * b + (bad != 0);
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10;
	char buf[64];
	long sum = 0;

	for (int i = 0; i < n; i++) {
		snprintf(buf, sizeof buf, "call-%d%s", i, i % 3 ? "" : "-with-a-longer-tail");
		sum += kcprobe_target(-i * 1000 + 7, buf, i, (const char *)16);
	}
	printf("%ld\n", sum);
	return 0;
}
