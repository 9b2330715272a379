/*
 * kcstack makes a getpid syscall from kcstack_c, called by main through
 * kcstack_a and kcstack_b, for each byte it reads from stdin, until EOF.
 * The syscall instruction is kcstack_c's own (no libc frame between), so
 * its call chain is kcstack_c, kcstack_b, kcstack_a, main.
 */
#include <unistd.h>

volatile long kcstack_pid;

__attribute__((noinline)) void kcstack_c(void)
{
	long ret;

#if defined(__x86_64__)
	__asm__ volatile("syscall" : "=a"(ret) : "a"(39L) : "rcx", "r11", "memory");
#elif defined(__aarch64__)
	register long x8 __asm__("x8") = 172;
	register long x0 __asm__("x0");
	__asm__ volatile("svc #0" : "=r"(x0) : "r"(x8) : "memory");
	ret = x0;
#else
#error "kcstack: no syscall instruction for this architecture"
#endif
	kcstack_pid = ret;
}

__attribute__((noinline)) void kcstack_b(void)
{
	kcstack_c();
	kcstack_pid++;
}

__attribute__((noinline)) void kcstack_a(void)
{
	kcstack_b();
	kcstack_pid++;
}

int main(void)
{
	char c;

	while (read(0, &c, 1) == 1)
		kcstack_a();
	return 0;
}
