package recorder

import (
	"errors"
	"fmt"
	"math/bits"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/kconsume/kconsume/gen"
)

// The recorder's own rings (kc_area in bpf/kc/area.h): per CPU, a ring
// of Config.RingSize bytes in an mmapable BPF array, in elements of at
// most areaMaxElem bytes, which the programs reserve in with one
// compare-and-swap of a position in kc_state and the drainer reads in
// place as it reads a BPF ring buffer. A BPF ring buffer's reservation
// takes a spinlock with interrupts off, and its commit another atomic
// operation (kernel/bpf/ringbuf.c): on a virtual machine whose interrupt
// flag is paravirtualised that was the largest part of a record's cost
// (BenchmarkRecorderFloor). The CPU's BPF ring buffer stays, one page,
// as the doorbell the writers wake the drainer through.

const (
	// areaMaxElem is the largest element: an array's value is at most
	// KMALLOC_MAX_SIZE, 4 MiB (kernel/bpf/arraymap.c:
	// array_map_alloc_check), and the elements' size is a power of two.
	areaMaxElem = 2 << 20
	// AreaMinRing is the smallest ring: an element must hold the largest
	// record (KC_AREA_MAX) many times over.
	AreaMinRing = 64 << 10
	// areaMaxMap bounds the whole array (array_map_alloc refuses sizes
	// near 4 GiB on older kernels).
	areaMaxMap = 2 << 30
	// bellSize is a doorbell ring's size: a wakeup is a 16-byte record
	// and the drainer empties it on every pass.
	bellSize = 4096
)

// AreaShape returns the element size and count of a ring of size bytes.
func AreaShape(size int) (elem, count int) {
	elem = min(size, areaMaxElem)
	return elem, size / elem
}

// areaUsable returns nil when a session of cfg on ncpu CPUs can record
// into kc_area rings, or why not. objects are the users' programs, which
// must be built with a kc_synth.h that has kc_area.
func areaUsable(cfg Config, ncpu int, transport Transport, objects []*ebpf.CollectionSpec) error {
	switch {
	case Testing.NoArea:
		return errors.New("turned off (KC_NO_AREA)")
	case transport != Ringbuf:
		return errors.New("needs BPF ring buffers for its doorbells")
	case cfg.Global:
		return errors.New("one ring of all CPUs (--global) is a BPF ring buffer")
	case runtime.GOARCH != "amd64":
		// The writers publish a record with a plain store after its
		// data, which only x86's store order makes a release.
		return fmt.Errorf("publishing records needs x86 store order, not %s", runtime.GOARCH)
	case cfg.RingSize < AreaMinRing:
		return fmt.Errorf("ring size %d is below %d", cfg.RingSize, AreaMinRing)
	case uint64(ncpu)*uint64(cfg.RingSize) > areaMaxMap:
		return fmt.Errorf("%d rings of %d bytes exceed %d", ncpu, cfg.RingSize, areaMaxMap)
	}
	for i, spec := range objects {
		if spec.Maps[gen.RingbufMapKcArea] == nil {
			return fmt.Errorf("BPF object %d was built with a kc_synth.h without kc_area", i+1)
		}
	}
	return HaveCmpxchg()
}

// HaveCmpxchg returns nil on Linux 5.12+, whose BPF has
// BPF_CMPXCHG, or why not. The release decides: a probe program was
// loaded by the 5.10 guest, whose verifier then refused the recorder
// ("BPF_STX uses reserved fields"), and a kernel whose verifier refuses
// the writers otherwise is caught by the load's fallback.
func HaveCmpxchg() error {
	major, minor, err := kernelRelease()
	if err != nil {
		return err
	}
	if major < 5 || major == 5 && minor < 12 {
		return fmt.Errorf("BPF_CMPXCHG needs Linux 5.12, this is %d.%d", major, minor)
	}
	return nil
}

// stripArea replaces the compare-and-swap instructions of kc_area's
// writers in spec's programs, dead code when kc_area_on is 0, by a move:
// kernels before 5.12 refuse any atomic instruction with an immediate,
// reached or not (kernel/bpf/verifier.c:resolve_pseudo_ldimm64 checks
// every instruction's reserved fields before the walk).
func stripArea(spec *ebpf.CollectionSpec) {
	for _, p := range spec.Programs {
		for i := range p.Instructions {
			ins := &p.Instructions[i]
			if ins.OpCode.Class() == asm.StXClass && ins.OpCode.Mode() == asm.AtomicMode && ins.OpCode.AtomicOp() == asm.CmpXchg {
				*ins = asm.Mov.Imm(asm.R0, 0).WithMetadata(ins.Metadata)
			}
		}
	}
}

// setupArea sizes kc_area in spec and sets the variables that turn it on,
// in set, for a session of cfg on ncpu CPUs, in packet mode (packet.go)
// when pkt is set.
func setupArea(spec *ebpf.CollectionSpec, set map[string]any, cfg Config, ncpu int, prefix string, pkt bool) {
	elem, count := AreaShape(cfg.RingSize)
	if pkt {
		elem, count = pktShape(cfg)
	}
	if _, ok := spec.Variables[gen.RingbufVarKcPktOn]; ok {
		set[gen.RingbufVarKcPktOn] = boolU32(pkt)
	}
	m := spec.Maps[prefix]
	m.ValueSize = uint32(elem)
	m.MaxEntries = uint32(ncpu * count)
	set[gen.RingbufVarKcAreaOn] = uint32(1)
	set[gen.RingbufVarKcAreaEsize] = uint64(elem)
	set[gen.RingbufVarKcAreaEshift] = uint32(bits.TrailingZeros(uint(elem)))
	set[gen.RingbufVarKcAreaKmask] = uint32(count - 1)
	set[gen.RingbufVarKcAreaRsize] = uint64(cfg.RingSize)
	set[gen.RingbufVarKcAreaLshift] = uint32(bits.TrailingZeros(uint(cfg.RingSize)))
}

// mapArea maps kc_area of coll, loaded for ncpu rings of ringSize bytes:
// every CPU's ring, adjacent.
func mapArea(coll *ebpf.Collection, ncpu, ringSize int) ([]byte, error) {
	m := coll.Maps[gen.RingbufMapKcArea]
	// Writable: the drainer zeroes the space it releases (ringbuf.release).
	mem, err := unix.Mmap(m.FD(), 0, ncpu*ringSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping kc_area: %w", err)
	}
	return mem, nil
}
