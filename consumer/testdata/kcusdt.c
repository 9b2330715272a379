/*
 * kcusdt: the USDT test's workload. Each round fires kcusdt:tick with
 * known arguments of each size and sign, and kcusdt:gated only while a
 * tracer holds its semaphore.
 */
#define _SDT_HAS_SEMAPHORES 1
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

/* sys/sdt.h names a probe's semaphore PROVIDER_NAME_semaphore. */
unsigned short kcusdt_tick_semaphore __attribute__((unused, section(".probes")));
unsigned short kcusdt_gated_semaphore __attribute__((unused, section(".probes")));

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10;
	char buf[32];

	for (int i = 0; i < n; i++) {
		long big = -100000L * i;
		short small = (short)(3 * i - 50);
		unsigned char byte = (unsigned char)(200 + i);

		snprintf(buf, sizeof buf, "item-%d", i);
		DTRACE_PROBE5(kcusdt, tick, i, big, buf, small, byte);
		if (kcusdt_gated_semaphore)
			DTRACE_PROBE1(kcusdt, gated, i);
	}
	return 0;
}
