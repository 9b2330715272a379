/* kctrig: workloads of known count for the trigger tests (trigger_test.go).
 *   kctrig busy FILE SECONDS GAP_US   one process per CPU, pinned, named
 *                                     kctrig-busy, each opening and closing
 *                                     FILE (which exists) for SECONDS, GAP_US
 *                                     apart (0: back to back); prints each
 *                                     process's count of opens, "CPU N"
 *   kctrig miss PATH N GAP_US [UNLINK_AFTER_US]
 *                                     named kctrig-miss: N failing opens of
 *                                     PATH (which does not exist), GAP_US
 *                                     apart; then, when UNLINK_AFTER_US is
 *                                     given, that long later one failing
 *                                     unlinkat of PATH; prints the
 *                                     CLOCK_MONOTONIC ns of the first and
 *                                     the last open, "first last" */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void nap(long us)
{
	struct timespec ts = {us / 1000000, (us % 1000000) * 1000};

	if (us > 0)
		nanosleep(&ts, NULL);
}

static int busy(const char *file, double secs, long gap)
{
	int ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int fds[2];

	if (pipe(fds))
		return 2;
	for (int c = 0; c < ncpu; c++) {
		pid_t p = fork();

		if (p < 0)
			return 3;
		if (p == 0) {
			cpu_set_t set;
			long long end, n = 0;
			char line[64];
			int len;

			CPU_ZERO(&set);
			CPU_SET(c, &set);
			sched_setaffinity(0, sizeof(set), &set);
			prctl(PR_SET_NAME, "kctrig-busy", 0, 0, 0);
			end = now_ns() + (long long)(secs * 1e9);
			while (now_ns() < end) {
				int fd = open(file, O_RDONLY);

				if (fd >= 0)
					close(fd);
				n++;
				nap(gap);
			}
			len = snprintf(line, sizeof(line), "%d %lld\n", c, n);
			_exit(write(fds[1], line, len) == len ? 0 : 4);
		}
	}
	close(fds[1]);
	for (int c = 0; c < ncpu; c++) {
		int st;

		if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
			return 5;
	}
	char buf[4096];
	ssize_t k;

	while ((k = read(fds[0], buf, sizeof(buf))) > 0)
		fwrite(buf, 1, k, stdout);
	return 0;
}

static int miss(const char *path, int n, long gap, long unlink_after)
{
	long long first = 0, last = 0;

	prctl(PR_SET_NAME, "kctrig-miss", 0, 0, 0);
	for (int i = 0; i < n; i++) {
		long long t = now_ns();

		if (open(path, O_RDONLY) >= 0)
			return 2;
		if (!first)
			first = t;
		last = t;
		if (i + 1 < n)
			nap(gap);
	}
	if (unlink_after >= 0) {
		nap(unlink_after);
		if (unlinkat(AT_FDCWD, path, 0) == 0)
			return 3;
	}
	printf("%lld %lld\n", first, last);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "busy"))
		return busy(argv[2], atof(argv[3]), atol(argv[4]));
	if ((argc == 5 || argc == 6) && !strcmp(argv[1], "miss"))
		return miss(argv[2], atoi(argv[3]), atol(argv[4]), argc == 6 ? atol(argv[5]) : -1);
	fprintf(stderr, "usage: kctrig busy FILE SECONDS GAP_US | miss PATH N GAP_US [UNLINK_AFTER_US]\n");
	return 1;
}
