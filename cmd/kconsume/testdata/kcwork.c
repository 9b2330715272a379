/* kcwork: known workloads for the LTTng analyses tests (lttng_test.go).
 * Built static, so the dynamic loader adds no read of its own.
 *   kcwork burn SECONDS          spin on the CPU for SECONDS, napping
 *                                100 us every 10 ms
 *   kcwork read FILE N GOFILE    open FILE now; once GOFILE exists, read
 *                                it 1 byte at a time N times, then exit
 *   kcwork fork N M OUT          fork N processes of M threads besides
 *                                their main one; every thread calls
 *                                getppid(2) 3 times and appends "PID TID"
 *                                to OUT
 *   kcwork prio NICE N           set its nice value to NICE, name itself
 *                                kcprio, sleep 5 ms N times, spin 50 ms
 *   kcwork dio FILE N SIZE       name itself kcdio; write N blocks of SIZE
 *                                bytes into FILE (which holds them) with
 *                                O_DIRECT, then read them back so */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
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

static int out_fd;

/* one_thread makes the calls the test counts and says who made them. */
static void *one_thread(void *arg)
{
	char line[64];
	int n;

	(void)arg;
	for (int i = 0; i < 3; i++)
		syscall(SYS_getppid);
	n = snprintf(line, sizeof(line), "%d %ld\n", (int)getpid(), (long)syscall(SYS_gettid));
	/* One write of O_APPEND: lines of threads never mix. */
	return write(out_fd, line, n) == n ? NULL : (void *)1;
}

static int forks(int n, int m, const char *out)
{
	out_fd = open(out, O_WRONLY | O_CREAT | O_APPEND, 0600);
	if (out_fd < 0)
		return 2;
	for (int i = 0; i < n; i++) {
		pid_t c = fork();
		if (c < 0)
			return 3;
		if (c == 0) {
			pthread_t t[64];
			int bad = 0;
			if (m > 64)
				_exit(4);
			for (int j = 0; j < m; j++)
				if (pthread_create(&t[j], NULL, one_thread, NULL))
					_exit(5);
			bad |= one_thread(NULL) != NULL;
			for (int j = 0; j < m; j++) {
				void *r;
				pthread_join(t[j], &r);
				bad |= r != NULL;
			}
			_exit(bad ? 6 : 0);
		}
	}
	for (int i = 0; i < n; i++) {
		int st;
		if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			return 7;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "fork") == 0)
		return forks(atoi(argv[2]), atoi(argv[3]), argv[4]);
	if (argc == 3 && strcmp(argv[1], "burn") == 0) {
		double end = now() + atof(argv[2]), nap = now() + 0.01;
		volatile unsigned long x = 0;
		while (now() < end) {
			for (int i = 0; i < 100000; i++)
				x++;
			/* lttng-cputop counts a task's time only between the
			 * switches it sees in its window: alone on its CPU, a
			 * burner that never slept would show 0 %. */
			if (now() >= nap) {
				usleep(100);
				nap = now() + 0.01;
			}
		}
		return 0;
	}
	if (argc == 4 && strcmp(argv[1], "prio") == 0) {
		double end;
		volatile unsigned long x = 0;
		/*
		 * The nice value first: a preemption between the two would
		 * otherwise record kcprio at its old priority.
		 */
		if (setpriority(PRIO_PROCESS, 0, atoi(argv[2])) || prctl(PR_SET_NAME, "kcprio"))
			return 2;
		for (int i = 0; i < atoi(argv[3]); i++)
			usleep(5000);
		end = now() + 0.05;
		while (now() < end)
			for (int i = 0; i < 100000; i++)
				x++;
		return 0;
	}
	if (argc == 5 && strcmp(argv[1], "dio") == 0) {
		int n = atoi(argv[3]);
		size_t size = atoi(argv[4]);
		void *buf;
		int fd = open(argv[2], O_RDWR | O_DIRECT);
		if (fd < 0 || prctl(PR_SET_NAME, "kcdio") || posix_memalign(&buf, 4096, size))
			return 2;
		memset(buf, 'k', size);
		for (int i = 0; i < n; i++)
			if (pwrite(fd, buf, size, (off_t)i * size) != (ssize_t)size)
				return 3;
		for (int i = 0; i < n; i++)
			if (pread(fd, buf, size, (off_t)i * size) != (ssize_t)size)
				return 4;
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
