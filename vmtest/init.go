package vmtest

// initScript is PID 1 of the guest, run by the initramfs's busybox. It
// loads the modules listed in /modules/order, mounts the host's root
// (9p, read-only) under a tmpfs overlay, mounts the kernel filesystems
// the suite needs inside it, runs the command script named by
// vmtest.script= in a chroot, and hands back its exit status twice: a
// console line carrying the run's nonce, then QEMU's isa-debug-exit port
// (QEMU exits with (value << 1) | 1), with poweroff as the fallback for
// kernels without /dev/port.
const initScript = `#!/bin/sh
export PATH=/bin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

arg() { sed -n "s/.*vmtest\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
nonce=$(arg nonce)
finish() {
	echo
	echo "vmtest-exit-status-$nonce: $1"
	sync
	if [ -c /dev/port ]; then
		printf "\\$(printf %o $(($1 & 127)))" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
	fi
	poweroff -f
	sleep 10
}
fail() { echo "vmtest: $*"; finish 125; }

for m in $(cat /modules/order); do
	insmod /modules/$m || fail "insmod $m failed"
done

mkdir -p /mnt/lower /mnt/rw /mnt/root
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /mnt/lower || fail "cannot mount the host root over 9p"
mount -t tmpfs -o mode=0755 tmpfs /mnt/rw
mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay -o lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work overlay /mnt/root || fail "cannot mount the overlay root"

r=/mnt/root
mount -t proc proc $r/proc
mount -t sysfs sysfs $r/sys
mount -t devtmpfs devtmpfs $r/dev
mkdir -p $r/dev/pts $r/dev/shm
mount -t devpts devpts $r/dev/pts
mount -t tmpfs tmpfs $r/dev/shm
mount -t tmpfs -o mode=0755 tmpfs $r/run
# The modules loaded above, for tests that load one while they record.
mkdir -p $r/run/vmtest-modules && cp /modules/*.ko $r/run/vmtest-modules/ 2>/dev/null
mount -t tracefs tracefs $r/sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs $r/sys/kernel/debug
mount -t bpf bpf $r/sys/fs/bpf
mount -t cgroup2 cgroup2 $r/sys/fs/cgroup
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up

script=$(arg script)
[ -n "$script" ] || fail "no vmtest.script= on the kernel command line"
echo "vmtest: guest $(uname -r) up, $(grep -c ^processor /proc/cpuinfo) CPUs"
chroot $r /bin/sh "$script"
finish $?
`

// runScript is the command script the init runs in the chroot: it enters
// the working directory, sets the environment and execs the command.
const runScript = `cd %s || exit 125
%sexec %s
`
