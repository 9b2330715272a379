package filter

import "testing"

// TestChanges checks the version table against the kernels whose
// sources were read (Debian's) and the one it was run on.
func TestChanges(t *testing.T) {
	for _, c := range []struct {
		rel  string
		feat Feature
		want bool
	}{
		{"5.10.223-amd64", FeatRelLoc, false},
		{"6.1.192", FeatRelLoc, true},
		{"6.1.192", FeatFunction, false},
		{"6.12.117", FeatFunction, true},
		{"6.1.192", FeatStacktrace, false},
		{"6.12.117", FeatStacktrace, true},
		{"6.1.192", FeatCPUS, false},
		{"6.12.117", FeatCPUS, true},
		{"5.10.223", FeatGlobLen, false},
		{"6.1.192", FeatGlobLen, true},
		{"6.1.192", FeatIncomplete, false},
		{"6.12.114", FeatIncomplete, false},
		{"6.12.117", FeatIncomplete, true},
		{"6.18.44-fc-v657", FeatIncomplete, false},
		{"7.3.4+deb13-amd64", FeatIncomplete, true},
	} {
		r, ok := ParseRelease(c.rel)
		if !ok {
			t.Fatalf("ParseRelease(%q) failed", c.rel)
		}
		if got := Has(r, c.feat); got != c.want {
			t.Errorf("Has(%s, %s) = %v, want %v", c.rel, c.feat, got, c.want)
		}
	}
	if olderVerdict(FeatIncomplete) != true || olderVerdict(FeatCPUS) != false {
		t.Error("olderVerdict: a refusing change's rows are accepted before it, the others refused")
	}
}
