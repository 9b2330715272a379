/* kcsym prints the runtime addresses of its own functions and of one in
 * libc ("NAME ADDRESS" a line), then waits for its stdin to close. */
#include <stdio.h>
#include <unistd.h>

volatile int kcsym_n;

__attribute__((noinline)) void kcsym_c(void) { kcsym_n++; }
__attribute__((noinline)) void kcsym_b(void) { kcsym_c(); kcsym_n++; }
__attribute__((noinline)) static void kcsym_a(void) { kcsym_b(); kcsym_n++; }

int main(void)
{
	char buf[1];

	kcsym_a();
	printf("kcsym_a %p\nkcsym_b %p\nkcsym_c %p\nmain %p\nwrite %p\n",
	       (void *)kcsym_a, (void *)kcsym_b, (void *)kcsym_c, (void *)main, (void *)write);
	fflush(stdout);
	while (read(0, buf, 1) > 0)
		;
	return 0;
}
