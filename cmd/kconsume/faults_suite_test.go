package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
)

// The fault suite (TestFaults): seeded, repeatable runs, each a getpid
// workload of known count recorded under one fault injected at a random
// point between its chunks. KC_FAULT_RUNS sets the number of runs (3 in
// make test, hundreds in make faults); KC_FAULT_SEED the first run's
// seed, run i taking seed+i, so that KC_FAULT_SEED=S KC_FAULT_RUNS=1
// repeats the run of seed S alone.

// The faults the suite injects.
const (
	faultRelaydKill = iota // SIGKILL relayd, maybe restart it later
	faultRelaydStop        // SIGSTOP relayd, SIGCONT it later
	faultRelaydCut         // close relayd's data connection in the middle of a packet
	faultDiskFull          // fill the local copy's tmpfs
	faultRecordKill        // SIGKILL record, then kconsume recover
	faultKinds
)

var faultNames = [faultKinds]string{"relayd-kill", "relayd-stop", "relayd-cut", "disk-full", "record-kill"}

// faultTally adds up what the runs did, for the suite's last line.
type faultTally struct {
	runs, faults                             int
	produced, inTrace, counted, uncounted    int
	unrecorded                               int // made after record stopped (full disk) or died (killed)
	relaydEvents, relaydPackets, notSentPkts int
}

// TestFaults runs the fault suite and checks, on every run, the
// invariant on the local copy: babeltrace2's events plus the events it
// reports discarded are the events made (within the known bounds when
// the fault stopped the recording: a full disk, a killed recorder), and
// record's summary says what the trace holds; on relayd's copy that
// every packet relayd has is one of the local copy's, in order, that
// sent + not sent is the local copy's packets, and that relayd has every
// event when it missed no packet.
func TestFaults(t *testing.T) {
	testenv.RequireRoot(t)
	runs, seed := testenv.FaultRuns(t, 3)
	var tally faultTally
	for i := range runs {
		s := seed + int64(i)
		kind := int(uint64(s) % faultKinds)
		t.Run(fmt.Sprintf("seed%d-%s", s, faultNames[kind]), func(t *testing.T) {
			faultRun(t, rand.New(rand.NewPCG(uint64(s), 1)), kind, s, &tally)
		})
	}
	t.Logf("%d runs, %d faults injected: %d events made, %d in the local copies, %d counted lost at their place, %d lost without a count, %d made after record stopped or died; relayd: %d events in %d packets, %d packets counted not sent",
		tally.runs, tally.faults, tally.produced, tally.inTrace, tally.counted, tally.uncounted, tally.unrecorded, tally.relaydEvents, tally.relaydPackets, tally.notSentPkts)
}

// faultRun is one run of the suite with fault kind, its randomness from
// rng; it adds what it saw to tally.
func faultRun(t *testing.T, rng *rand.Rand, kind int, seed int64, tally *faultTally) {
	chunks := make([]int, 4+rng.IntN(5))
	produced := 0
	for i := range chunks {
		chunks[i] = 5000 + rng.IntN(25000)
		produced += chunks[i]
	}
	at := 1 + rng.IntN(len(chunks)-1) // the fault comes after chunk at-1
	later := at + rng.IntN(len(chunks)-at+1)
	subbuf := []string{"16K", "64K", "256K"}[rng.IntN(3)]
	name := fmt.Sprintf("flt%d%s", seed, uniq)
	args := []string{"-e", "syscalls:sys_enter_getpid", "--comm", getpidsComm, "--subbuf-size", subbuf, "--duration", "10m"}
	t.Logf("%s: %d events in chunks %v, fault after chunk %d, sub-buffers of %s", faultNames[kind], produced, chunks, at, subbuf)

	var r *testenv.Relayd
	var proxy *cutProxy
	local := filepath.Join(t.TempDir(), "t")
	switch kind {
	case faultRelaydKill, faultRelaydStop, faultRelaydCut:
		r = testenv.StartRelayd(t)
		url := r.URL()
		if kind == faultRelaydCut {
			// Within the data the workload makes (over 12 bytes an
			// event), so that it cuts, in whatever packet then goes.
			proxy = startCutProxy(t, "127.0.0.1:"+strconv.Itoa(r.Data), int64(1+rng.IntN(12*produced)))
			url = fmt.Sprintf("net://127.0.0.1:%d:%d", r.Control, proxy.port())
		}
		args = append(args, "--relayd", url, "--relayd-hostname", "faults", "--relayd-timeout", "2s")
	case faultDiskFull:
		local = filepath.Join(mountTmpfs(t, 32<<20), "t")
	}
	rec := startRecording(t, name, append([]string{"-o", local}, args...)...)
	faults := 0
	before := 0 // events made before the fault
	recordDead := false
	for i, n := range chunks {
		if i == at {
			before = produced - sum(chunks[i:])
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
			faults++
			switch kind {
			case faultRelaydKill:
				r.Kill()
			case faultRelaydStop:
				r.Pause()
			case faultRelaydCut:
				faults-- // counted when it cuts
			case faultDiskFull:
				fillDisk(t, filepath.Dir(local))
			case faultRecordKill:
				_ = rec.cmd.Process.Kill()
				rec.wait(t)
				recordDead = true
				// What a killed record leaves; the next one of the
				// name would replace it.
				t.Cleanup(func() { _ = os.RemoveAll(filepath.Join("/run/kconsume", name)) })
			}
		}
		if i == later && i > at {
			switch kind {
			case faultRelaydKill:
				if rng.IntN(2) == 0 {
					r.Restart(t)
					faults++
				}
			case faultRelaydStop:
				r.Resume()
				faults++
			}
		}
		getpids(t, n)
	}
	if kind == faultRelaydStop {
		r.Resume()
	}
	if proxy != nil && proxy.cuts.Load() > 0 {
		faults++
	}
	code := 0
	if !recordDead {
		_ = rec.cmd.Process.Signal(os.Interrupt)
		code = rec.wait(t)
	}
	out := rec.out.String()
	tally.runs++
	tally.faults += faults
	tally.produced += produced

	switch kind {
	case faultRecordKill:
		if o, c := shell(t, testenv.KconsumeBin(t)+" recover "+local); c != 0 {
			t.Fatalf("recover after record was killed: exit %d\n%s", c, o)
		}
		events, discarded := traceCounts(t, local)
		// The recording's pinned counts and rings outlive it:
		// recover writes what its rings held and counts the rest,
		// so every event made before the kill is in the trace or
		// counted there, and none after it (the programs went with
		// the process).
		if events+discarded != before {
			t.Errorf("after a kill and recover: %d events and %d discarded, want %d (made before the kill)", events, discarded, before)
		}
		if left, _ := filepath.Glob(filepath.Join(local, consumer.CrashNote)); len(left) > 0 {
			t.Errorf("recover left the recording's note: %v", left)
		}
		if left, _ := filepath.Glob(fmt.Sprintf("/sys/fs/bpf/kconsume/%d-*", rec.cmd.Process.Pid)); len(left) > 0 {
			t.Errorf("recover left the recording's pins: %v", left)
		}
		tally.inTrace += events
		tally.counted += discarded
		tally.uncounted += max(0, before-events-discarded)
		tally.unrecorded += produced - before
		return
	case faultDiskFull:
		if code != 1 || !strings.Contains(out, "disk full") {
			t.Fatalf("record on a full disk: exit %d, want 1 and a disk-full message\n%s", code, out)
		}
		events, discarded := traceCounts(t, local)
		recorded, lost := summaryCounts(t, out)
		if recorded != events || lost != discarded {
			t.Errorf("summary: %d recorded, %d discarded; babeltrace2: %d events, %d discarded\n%s", recorded, lost, events, discarded, out)
		}
		// The gate was open for every event before the disk filled;
		// those after record stopped are not events.
		if events+discarded < before || events+discarded > produced {
			t.Errorf("%d events and %d discarded: want from %d (made before the disk filled) to %d\n%s", events, discarded, before, produced, out)
		}
		if _, err := os.Stat(filepath.Join(local, relayfmt.ReserveFile)); err == nil {
			t.Error("record left its reserve file")
		}
		tally.inTrace += events
		tally.counted += discarded
		tally.unrecorded += max(0, produced-events-discarded)
		return
	}
	if code != 0 {
		t.Fatalf("record: exit %d\n%s", code, out)
	}
	events, discarded := traceCounts(t, local)
	checkTrace(t, "local copy", local, produced, out)
	tally.inTrace += events
	tally.counted += discarded
	tally.uncounted += max(0, produced-events-discarded)
	faultRelaydSide(t, r, name, local, subbuf, out, events, tally)
}

// faultRelaydSide checks relayd's sessions of a run against its local
// copy and adds what relayd holds to tally.
func faultRelaydSide(t *testing.T, r *testenv.Relayd, name, local, subbuf, out string, localEvents int, tally *faultTally) {
	t.Helper()
	size := map[string]int{"16K": 16 << 10, "64K": 64 << 10, "256K": 256 << 10}[subbuf]
	sent, notSent := relaydCounts(t, out)
	if localPackets := packetsIn(t, local, int64(size)); sent+notSent != localPackets {
		t.Errorf("relayd: %d packets sent + %d not sent, %d in the local copy\n%s", sent, notSent, localPackets, out)
	}
	dirs, _ := filepath.Glob(filepath.Join(r.Out, "faults", name+"-*", "kernel"))
	var events int
	var packets uint64
	for _, d := range dirs {
		if fi, err := os.Stat(filepath.Join(d, relayfmt.MetadataFile)); err != nil || fi.Size() == 0 {
			if packetsIn(t, d, int64(size)) != 0 {
				t.Errorf("relayd's %s holds packets and no metadata", d)
			}
			continue // relayd went before the session had its metadata
		}
		// A killed relayd may have been in the middle of a packet.
		if _, err := relayfmt.Recover(d); err != nil {
			t.Errorf("recover relayd's %s: %v", d, err)
			continue
		}
		n, _ := traceCounts(t, d)
		events += n
		packets += packetsIn(t, d, int64(size))
		checkSubsequence(t, d, local, size)
	}
	// relayd confirmed those it wrote; it may have written some of those
	// in flight when it went, unconfirmed.
	if packets < sent || packets > sent+notSent {
		t.Errorf("relayd holds %d packets: want from the %d it confirmed to the %d sent\n%s", packets, sent, sent+notSent, out)
	}
	if events > localEvents {
		t.Errorf("relayd holds %d events, more than the local copy's %d", events, localEvents)
	}
	if notSent == 0 && events != localEvents {
		t.Errorf("relayd missed no packet, and holds %d events of the local copy's %d\n%s", events, localEvents, out)
	}
	tally.relaydEvents += events
	tally.relaydPackets += int(packets)
	tally.notSentPkts += int(notSent)
}

// checkSubsequence checks that every packet of each stream file in dir
// is one of the same stream's packets in local, in the same order.
func checkSubsequence(t *testing.T, dir, local string, size int) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "trace*"))
	for _, f := range files {
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			continue // a stream announced at the start that had no packet
		}
		want, err := os.ReadFile(filepath.Join(local, filepath.Base(f)))
		if err != nil {
			t.Errorf("relayd has %s, the local copy has not: %v", f, err)
			continue
		}
		j := 0
		for i := 0; i+size <= len(got); i += size {
			p := got[i : i+size]
			for j+size <= len(want) && !bytes.Equal(want[j:j+size], p) {
				j += size
			}
			if j+size > len(want) {
				h := sha256.Sum256(p)
				t.Errorf("relayd's %s: packet %d (sha256 %x) is not among the local copy's packets after those before it", f, i/size, h[:6])
				break
			}
			j += size
		}
	}
}

func sum(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}

// cutProxy forwards TCP connections to a target and, once, closes the
// one that carries its after-th byte from the client, in the middle of
// whatever it carries then: relayd's data connection cut mid-packet.
// Later connections it forwards whole.
type cutProxy struct {
	ln     net.Listener
	target string
	after  int64
	cuts   atomic.Int32
	sent   atomic.Int64
	mu     sync.Mutex
	conns  []net.Conn
}

// startCutProxy listens on a free loopback port, closed when t ends.
func startCutProxy(t *testing.T, target string, after int64) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, after: after}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

func (p *cutProxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(c, u); c.Close() }()
		go p.forward(c, u)
	}
}

// forward copies the client's bytes to upstream, cutting both at the
// proxy's byte if this connection carries it.
func (p *cutProxy) forward(c, u net.Conn) {
	defer u.Close()
	defer c.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			b := buf[:n]
			before := p.sent.Add(int64(n)) - int64(n)
			if p.cuts.Load() == 0 && before < p.after && before+int64(n) >= p.after {
				_, _ = u.Write(b[:p.after-before])
				p.cuts.Add(1)
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.SetLinger(0) // a reset, as a dropped link
				}
				return
			}
			if _, werr := u.Write(b); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
