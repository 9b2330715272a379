package hot

import (
	"strings"
	"testing"
)

// TestTable: every event of the table has layouts whose field types and
// argument declarations the table knows, each field an expression, no
// two fields or events of one name, and no two layouts alike (the
// recorder picks the first that matches a kernel's format and
// prototype).
func TestTable(t *testing.T) {
	seen := map[string]bool{}
	for _, e := range Events {
		if seen[e.Name] {
			t.Errorf("%s twice in the table", e.Name)
		}
		seen[e.Name] = true
		if len(e.Layouts) == 0 {
			t.Errorf("%s: no layout", e.Name)
		}
		shapes := map[string]bool{}
		for i, l := range e.Layouts {
			s, err := l.Shapes()
			if err != nil {
				t.Errorf("%s layout %d: %v", e.Name, i, err)
				continue
			}
			key := l.key(s)
			if shapes[key] {
				t.Errorf("%s layout %d: the same fields and arguments as an earlier one", e.Name, i)
			}
			shapes[key] = true
			names := map[string]bool{}
			for _, f := range l.Fields {
				if names[f.Name] || f.Expr == "" {
					t.Errorf("%s layout %d: field %q twice or without an expression", e.Name, i, f.Name)
				}
				names[f.Name] = true
			}
			for _, a := range l.Args {
				if _, err := ArgSize(a); err != nil {
					t.Errorf("%s layout %d: %v", e.Name, i, err)
				}
			}
		}
	}
}

// key renders a layout's shape and arguments, to compare two.
func (l Layout) key(shapes []Shape) string {
	var b strings.Builder
	for i, s := range shapes {
		b.WriteString(l.Fields[i].Name)
		b.WriteString(strings.Repeat("#", s.Size))
	}
	b.WriteString("|" + strings.Join(l.Args, ","))
	return b.String()
}

// TestShapes: the record's fields lie where the C compiler puts them in
// struct trace_event_raw_*: each at a multiple of its size after the
// common fields' 8 bytes, a char array anywhere; the size ends at the
// last field.
func TestShapes(t *testing.T) {
	l := Layout{Fields: []Field{{"comm", "char[16]", "p->comm"}, {"pid", "pid_t", "p->pid"},
		{"flag", "bool", "b"}, {"runtime", "u64", "r"}, {"parent", "char[16]", "q->comm"}, {"cpu", "int", "c"}}}
	s, err := l.Shapes()
	if err != nil {
		t.Fatal(err)
	}
	want := []int{8, 24, 28, 32, 40, 56}
	for i, w := range want {
		if s[i].Offset != w {
			t.Errorf("%s at %d, want %d", l.Fields[i].Name, s[i].Offset, w)
		}
	}
	if l.Size() != 60 {
		t.Errorf("size %d, want 60", l.Size())
	}
	for _, bad := range []string{"char[]", "char[0]", "float", "char[16"} {
		if _, err := TypeShape(bad); err == nil {
			t.Errorf("TypeShape(%q) did not fail", bad)
		}
	}
	for decl, want := range map[string]int{"struct task_struct *p": 8, "work_func_t function": 8, "enum hrtimer_mode mode": 4,
		"bool was_armed": 1, "unsigned long call_site": 8, "unsigned int vec_nr": 4} {
		if got, err := ArgSize(decl); err != nil || got != want {
			t.Errorf("ArgSize(%q) = %d, %v; want %d", decl, got, err, want)
		}
	}
	if _, err := ArgSize("p"); err == nil {
		t.Error("ArgSize of a declaration without a type did not fail")
	}
}
