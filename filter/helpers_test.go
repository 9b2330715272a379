package filter

import (
	"bufio"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kconsume/kconsume/consumer/tracefs"
)

// formats are the events of testdata, by "system:name": format files
// copied from a 6.18 kernel's tracefs, and rel_test, made up to hold the
// field types no stock event combines.
var formatFiles = map[string]string{
	"sched:sched_switch":        "sched_sched_switch.format",
	"sched:sched_wakeup":        "sched_sched_wakeup.format",
	"sched:sched_process_exec":  "sched_sched_process_exec.format",
	"syscalls:sys_enter_openat": "syscalls_sys_enter_openat.format",
	"syscalls:sys_enter_lseek":  "syscalls_sys_enter_lseek.format",
	"task:task_rename":          "task_task_rename.format",
	"ftrace:print":              "ftrace_print.format",
	"ipi:ipi_send_cpumask":      "ipi_ipi_send_cpumask.format",
	"test:rel_test":             "rel_loc.format",
}

// testFormat returns the testdata format of event "system:name".
func testFormat(t testing.TB, event string) *tracefs.Format {
	t.Helper()
	file, ok := formatFiles[event]
	if !ok {
		t.Fatalf("no testdata format for %s", event)
	}
	b, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	sys, _, _ := strings.Cut(event, ":")
	f, err := tracefs.ParseFormat(sys, b)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// kallsyms is /proc/kallsyms as Symbols: a symbol ends where the next
// one starts, as kallsyms_lookup_size_offset has it.
type kallsyms struct {
	addrs []uint64
	names []string
	by    map[string]int
}

// readKallsyms returns the running kernel's symbols, or nil when they
// are hidden (addresses all zero).
func readKallsyms(t testing.TB) *kallsyms {
	t.Helper()
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		return nil
	}
	defer f.Close()
	type sym struct {
		addr uint64
		name string
	}
	var syms []sym
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.Fields(sc.Text())
		if len(parts) < 3 || len(parts) > 3 {
			continue
		}
		a, err := strconv.ParseUint(parts[0], 16, 64)
		if err != nil || a == 0 {
			continue
		}
		syms = append(syms, sym{a, parts[2]})
	}
	if len(syms) == 0 {
		return nil
	}
	sort.Slice(syms, func(i, j int) bool { return syms[i].addr < syms[j].addr })
	k := &kallsyms{by: map[string]int{}}
	for i, s := range syms {
		k.addrs = append(k.addrs, s.addr)
		k.names = append(k.names, s.name)
		if _, dup := k.by[s.name]; !dup {
			k.by[s.name] = i
		}
	}
	return k
}

func (k *kallsyms) end(i int) uint64 {
	for j := i + 1; j < len(k.addrs); j++ {
		if k.addrs[j] > k.addrs[i] {
			return k.addrs[j]
		}
	}
	return k.addrs[i] + 1
}

func (k *kallsyms) Lookup(name string) (uint64, uint64, bool) {
	i, ok := k.by[name]
	if !ok {
		return 0, 0, false
	}
	return k.addrs[i], k.end(i), true
}

func (k *kallsyms) Containing(addr uint64) (uint64, uint64, bool) {
	i := sort.Search(len(k.addrs), func(i int) bool { return k.addrs[i] > addr }) - 1
	if i < 0 {
		return 0, 0, false
	}
	return k.addrs[i], k.end(i), true
}
