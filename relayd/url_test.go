package relayd

import "testing"

func TestParseURL(t *testing.T) {
	for in, want := range map[string]URL{
		"net://collector":            {"collector", 5342, 5343},
		"net://10.0.0.1:6000":        {"10.0.0.1", 6000, 5343},
		"net://localhost:6000:6001":  {"localhost", 6000, 6001},
		"net6://[::1]":               {"::1", 5342, 5343},
		"net6://[fe80::1]:7000:7001": {"fe80::1", 7000, 7001},
	} {
		got, err := ParseURL(in)
		if err != nil || got != want {
			t.Errorf("ParseURL(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "collector", "tcp://h", "file:///tmp", "net://", "net://h:0", "net://h:70000",
		"net://h:x", "net://h:1:2:3", "net://h/path", "net6://[::1", "net://::1", "net://h:5343", "net6://[::1]x"} {
		if u, err := ParseURL(in); err == nil {
			t.Errorf("ParseURL(%q) = %+v, want an error", in, u)
		}
	}
	u, _ := ParseURL("net6://[::1]:1:2")
	if u.String() != "net6://[::1]:1:2" || u.ControlAddr() != "[::1]:1" || u.DataAddr() != "[::1]:2" {
		t.Errorf("%s %s %s", u, u.ControlAddr(), u.DataAddr())
	}
}
