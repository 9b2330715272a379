/* kcwork: known workloads for the LTTng analyses tests (lttng_test.go).
 * Built static, so the dynamic loader adds no read of its own.
 *   kcwork burn SECONDS          spin on the CPU for SECONDS
 *   kcwork read FILE N GOFILE    open FILE now; once GOFILE exists, read
 *                                it 1 byte at a time N times, then exit */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "burn") == 0) {
		double end = now() + atof(argv[2]);
		volatile unsigned long x = 0;
		while (now() < end)
			for (int i = 0; i < 100000; i++)
				x++;
		return 0;
	}
	if (argc == 5 && strcmp(argv[1], "read") == 0) {
		int fd = open(argv[2], O_RDONLY);
		int n = atoi(argv[3]);
		char b;
		if (fd < 0)
			return 2;
		while (access(argv[4], F_OK) != 0)
			usleep(10000);
		usleep(20000);
		for (int i = 0; i < n; i++)
			if (read(fd, &b, 1) != 1)
				return 3;
		usleep(20000);
		return 0;
	}
	return 1;
}
