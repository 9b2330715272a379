package synth

import (
	"fmt"
	"strings"
)

// defCase is one definition of the table held against the kernel's
// synthetic_events: kernel is its verdict there (gathered on Debian's
// 6.1, 6.12 and 7.3 guests, and checked again by TestKernelAgrees on
// every kernel of the matrix), kc says where kconsume parts from it on
// purpose: "ext" accepts what the kernel refuses (integer arrays), and
// "refuse" refuses what it accepts (what a trace cannot hold), with an
// error containing why.
type defCase struct {
	def    string
	kernel bool
	kc     string
	why    string
}

// defTable returns the definitions. Event names are unique per row (the
// vmtest test creates each in turn) and start with kc28_ where the row
// is not about the name.
func defTable() []defCase {
	var rows []defCase
	ok := func(def string) { rows = append(rows, defCase{def: def, kernel: true}) }
	no := func(def string) { rows = append(rows, defCase{def: def}) }
	n := 0
	ev := func() string { n++; return fmt.Sprintf("kc28_%d", n) }

	// Every type the kernel knows, and signedness (synth_field_signed).
	for _, t := range []string{"u8", "u16", "u32", "u64", "s8", "s16", "s32", "s64", "char", "unsigned char",
		"int", "unsigned int", "long", "unsigned long", "bool", "pid_t", "gfp_t"} {
		ok(ev() + " " + t + " f")
	}
	ok(ev() + " u64 a; s8 b; bool c; gfp_t d; unsigned long e; long f; char g; unsigned char h")
	// Types the kernel does not know.
	for _, t := range []string{"short", "long long", "size_t", "float", "signed char", "unsigned short",
		"void *", "u32*", "unsigned", "unsigned u32", "unsigned pid_t", "U32", "uint32_t", "__u32", "char*"} {
		no(ev() + " " + t + " f")
	}
	// Fixed strings, both spellings; sizes as kstrtouint reads them.
	for _, d := range []string{"char[16] s", "char s[16]", "char[1] s", "char[256] s", "char s[010]", "char s[+5]",
		"char s[0x1]", "unsigned char[8] s", "xchar[4] s", "unsigned char s[8]", "char s[0]", "char[00] s"} {
		ok(ev() + " " + d)
	}
	for _, d := range []string{"char[257] s", "char s[0x10]", "char s[08]", "char s[-1]", "char[16] s[4]", "char s[16]x",
		"char s[", "char[ s", "char s[1000]", "char s[ 4]", "char s[4 ]", "char s[x]", "char s[0x]", "char s[+]",
		"char[16]] s", "]char[4] s", "char s]", "char[4]long[ s"} {
		no(ev() + " " + d)
	}
	// Dynamic strings and stacks.
	for _, d := range []string{"char[] s", "char s[]", "unsigned char[] s", "unsigned long[] stack", "long[] stack",
		"long stack[]", "long[4] stack", "unsigned long stack[]", "xlong[] stack", "long stack[garbage]"} {
		ok(ev() + " " + d)
	}
	// Integer arrays: none in the kernel; fixed ones are kconsume's.
	for _, d := range []string{"u32 a[4]", "u32[4] a", "s16 a[3]", "int a[2]", "u8 a[4096]", "bool a[2]", "pid_t a[1]"} {
		rows = append(rows, defCase{def: ev() + " " + d, kc: "ext"})
	}
	for _, d := range []string{"u64[] a", "int[] a", "u32 a[]", "u32 a[0]", "u32 a[4097]", "u32 a[0x4]", "u32 a[4][2]", "short a[4]"} {
		no(ev() + " " + d)
	}
	// Separators: semicolons, spaces, tabs, words without semicolons,
	// comments.
	ok(ev() + " u32 a u32 b")
	ok(ev() + " u32 a;; ;u32 b;")
	ok(ev() + "   u32    a ;\tu64\tb  ")
	ok("  \t" + ev() + "\tu32 a")
	ok(ev() + " u32 a # a comment")
	ok(ev() + " u32 a;u32 b#;u32 c")
	ok(ev() + " unsigned int a unsigned long b")
	ok(ev() + " u32 a\v; u32 b\f")
	no(ev() + ";u32 a")
	no(ev() + " ;u32 a")
	no(ev() + " u32")
	no(ev() + " u32 a b")
	no(ev() + " u32 a; u32")
	no(ev() + " unsigned int")
	no(ev() + " # u32 a")
	no(ev())
	no("")
	no("   ")
	no(";")
	no("# only a comment")
	no("!" + ev())
	// Names.
	for _, d := range []string{"u32 _a", "u32 A", "u32 a9", "u32 _", "u32 " + strings.Repeat("f", 255)} {
		ok(ev() + " " + d)
	}
	for _, d := range []string{"u32 9a", "u32 a-b", "u32 a.b", "u32 a:b", "u32 [4]", "char [4]"} {
		no(ev() + " " + d)
	}
	for _, name := range []string{"_kc28", "Kc28_upper", "kc28_" + strings.Repeat("n", 60), "kc28_" + strings.Repeat("m", 240)} {
		ok(name + " u32 a")
	}
	for _, name := range []string{"9kc28", "kc28-n", "kc28.n", "kc28:n", "synthetic:kc28"} {
		no(name + " u32 a")
	}
	// Lax in the kernel, refused here: duplicate names, names our format
	// cannot hold.
	rows = append(rows,
		defCase{def: ev() + " u32 a; u64 a", kernel: true, kc: "refuse", why: "duplicate field name"},
		defCase{def: ev() + " u32 a; char a[4]", kernel: true, kc: "refuse", why: "duplicate field name"},
		defCase{def: "kc28_" + strings.Repeat("l", 241) + " u32 a", kernel: true, kc: "refuse", why: "at most 245"},
		defCase{def: "kc28_" + strings.Repeat("l", 295) + " u32 a", kernel: true, kc: "refuse", why: "at most 245"},
		defCase{def: ev() + " u32 " + strings.Repeat("f", 256), kernel: true, kc: "refuse", why: "at most 255"},
		defCase{def: ev() + " u32 " + strings.Repeat("f", 300), kernel: true, kc: "refuse", why: "at most 255"},
		defCase{def: ev() + " long[] " + strings.Repeat("s", 250), kernel: true, kc: "refuse", why: "at most 247"},
		defCase{def: ev() + " unsigned long[] st; u32 _st_length", kernel: true, kc: "refuse", why: "count in the trace"},
		defCase{def: ev() + " u32 _st_length; long[] st", kernel: true, kc: "refuse", why: "is taken"},
		defCase{def: "kc28_\xe9 u32 a", kernel: true, kc: "refuse", why: "not ASCII"},
		defCase{def: ev() + " u32 f\xe9", kernel: true, kc: "refuse", why: "not ASCII"},
		defCase{def: ev() + " u32 a\xa0u32 b", kernel: true},
	)
	no("kc28_\xd7 u32 a")
	// 64 and 65 fields.
	for _, count := range []int{64, 65} {
		fields := make([]string, count)
		for i := range fields {
			fields[i] = fmt.Sprintf("u8 f%d", i)
		}
		rows = append(rows, defCase{def: ev() + " " + strings.Join(fields, "; "), kernel: count <= MaxFields})
	}
	// The kernel's longest line (with its newline, one write).
	long := ev() + " u32 a"
	rows = append(rows, defCase{def: long + strings.Repeat(" ", maxLine-len(long)), kernel: true},
		defCase{def: ev() + " u32 a" + strings.Repeat(" ", maxLine)})
	return rows
}
