package probe

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestParse checks probes that parse into the fetch steps and formats
// the kernel's parser would make of them, and those refused with the
// reason.
func TestParse(t *testing.T) {
	p, err := Parse(`uprobe:/bin/x:f+4 a=%di:s32 +8(+0(%sp)):u16 s=+0(%si):string $comm k=$stack2 i=\-3`)
	if err != nil {
		t.Fatal(err)
	}
	f := p.Format(Common(), 7)
	var got []string
	for _, fl := range f.Fields {
		got = append(got, fl.Name+":"+fl.Type)
	}
	if want := "__probe_ip:unsigned long a:s32 arg2:u16 s:char arg4:char k:x64 i:x64"; strings.Join(got, " ") != want {
		t.Errorf("fields %q, want %q", strings.Join(got, " "), want)
	}
	if p.Offset != 4 || p.Path != "/bin/x" || p.Symbol != "f" || f.FullName() != "uprobes:f" || f.Fields[0].Offset != 8 || f.FixedSize() != 8+8+4+2+4+4+8+8 {
		t.Errorf("probe %+v, format %+v", p, f)
	}
	a := p.Args[1].Fetch
	if a.Base != Reg || len(a.Derefs) != 2 || a.Derefs[0].Off != 0 || a.Derefs[1].Off != 8 || !a.Derefs[1].User {
		t.Errorf("+8(+0(%%sp)): %+v", a)
	}
	if i := p.Args[5].Fetch; i.Base != Imm || i.N != -3 {
		t.Errorf(`\-3: %+v`, i)
	}
	r, err := Parse("kretprobe:vfs_read r=$retval:s64 s=+u0(%si):string")
	if err != nil || r.FullName() != "kprobes:vfs_read__return" || !r.Args[1].Fetch.Derefs[0].User {
		t.Errorf("kretprobe: %+v, %v", r, err)
	}
	for _, bad := range []struct{ spec, says string }{
		{"uprobe:/bin/x", "want uprobe:PATH:SYMBOL"},
		{"uprobe:x:f", "not absolute"},
		{"nprobe:f", "want uprobe:PATH:SYMBOL"},
		{"uretprobe:/bin/x:f+4", "no offset"},
		{"uprobe:/bin/x:f $retval", "only for return probes"},
		{"uprobe:/bin/x:f $arg1", "only for kprobes"},
		{"kprobe:f a=%di:b4@0/32", "not supported yet"},
		{"kprobe:f a=@sym", "@SYMBOL is not supported yet"},
		{"kprobe:f common_pid=%di", "is taken"},
		{"kprobe:f +1(+2(+3(+4(+5(%di))))):u8", "more than 4 dereferences"},
		{"kprobe:f " + strings.Repeat("%di ", 13), "at most 12"},
		{"usdt:/bin/x:p", "want usdt:PATH:PROVIDER:NAME"},
	} {
		if _, err := Parse(bad.spec); err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("Parse(%q): %v, want an error saying %q", bad.spec, err, bad.says)
		}
	}
}

// TestKprobeBTFParams names a kprobe's arguments by their BTF names:
// each comes from the register its position gives it, typed from BTF.
func TestKprobeBTFParams(t *testing.T) {
	if _, err := KernelBTF(); err != nil {
		t.Skipf("no kernel BTF: %v", err)
	}
	p, err := Parse("kprobe:do_sys_openat2 dfd filename:ustring how")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range p.Args {
		got = append(got, fmt.Sprintf("%s=%%%s:%s", a.Name, regs[a.Fetch.N], a.Type.Name))
	}
	if want := "dfd=%di:s32 filename=%si:ustring how=%dx:x64"; strings.Join(got, " ") != want {
		t.Errorf("got %s, want %s", strings.Join(got, " "), want)
	}
	if _, err := Parse("kprobe:do_sys_openat2+4 dfd"); err == nil {
		t.Error("a parameter by name past the function's start: taken")
	}
}

// TestGlobName names the events of glob specs, and takes blank and
// non-glob specs as no glob.
func TestGlobName(t *testing.T) {
	for spec, want := range map[string]string{
		"kprobe:vfs_* a=%di": "kprobes:vfs_*", "kretprobe:vfs_r?ad": "kprobes:vfs_r?ad__return",
		"fexit:tcp_*": "fprobes:tcp_*__return", "kprobe:vfs_read": "", "uprobe:/bin/x:*": "", "": "", "   ": "",
	} {
		if got, ok := GlobName(spec); got != want || ok != (want != "") {
			t.Errorf("GlobName(%q) = %q, %v; want %q", spec, got, ok, want)
		}
	}
}

// TestUSDTArgs reads the argument specs compilers write into notes.
func TestUSDTArgs(t *testing.T) {
	args, err := usdtArgs("-4@%ebx -8@%r14 8@%rbp -2@-18(%rbp) 1@%dl 4@$42 8@%r9d -4@16(%rsp)")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range args {
		f := a.Fetch
		s := a.Name + "=" + a.Type.Name
		switch {
		case f.Base == Imm:
			s += " imm"
		case len(f.Derefs) > 0:
			s += " " + regs[f.N] + "+deref"
		default:
			s += " " + regs[f.N]
		}
		got = append(got, s)
	}
	want := "arg1=s32 bx arg2=s64 r14 arg3=u64 bp arg4=s16 bp+deref arg5=u8 dx arg6=u32 imm arg7=u64 r9 arg8=s32 sp+deref"
	if strings.Join(got, " ") != want {
		t.Errorf("got  %s\nwant %s", strings.Join(got, " "), want)
	}
	for _, bad := range []string{"4@(%rax,%rbx,4)", "8@%fs:16", "8@foo(%rip)", "3@%eax", "4@%xyz"} {
		if _, err := usdtArgs(bad); err == nil {
			t.Errorf("usdtArgs(%q) took it", bad)
		}
	}
}

// FuzzNotes feeds the note reader arbitrary ELF files, from a real one
// with USDT notes: it returns notes or an error, and never panics.
func FuzzNotes(f *testing.F) {
	if cc, err := exec.LookPath("cc"); err == nil {
		bin := filepath.Join(f.TempDir(), "kcusdt")
		if exec.Command(cc, "-O2", "-o", bin, "../testdata/kcusdt.c").Run() == nil {
			if b, err := os.ReadFile(bin); err == nil {
				f.Add(b)
			}
		}
	}
	f.Add([]byte("\x7fELF"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ef, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return
		}
		notes, err := notesOf(ef, "*:*")
		if err == nil {
			for _, n := range notes {
				_, _ = usdtArgs(n.Args)
			}
		}
	})
}

// TestBlacklisted reads the kprobe blacklist's lines, with and without a
// module, and fails on a file that is not there.
func TestBlacklisted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "blacklist")
	text := "0xffffffff81001000-0xffffffff81001040\tdo_int3\n0xffffffffc0001000-0xffffffffc0001020\tmod_fn [kvm]\n\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	for sym, want := range map[string]bool{"do_int3": true, "mod_fn": true, "do_int": false, "kvm": false, "": false} {
		if got, err := Blacklisted(path, sym); err != nil || got != want {
			t.Errorf("Blacklisted(%q) = %v, %v; want %v", sym, got, err, want)
		}
	}
	if _, err := Blacklisted(filepath.Join(t.TempDir(), "none"), "do_int3"); err == nil {
		t.Error("a blacklist that is not there: no error")
	}
}
