package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/internal/control"
	"github.com/kconsume/kconsume/synth"
)

// synthStore is where definitions persist; tests point it elsewhere.
var synthStore = synth.Store{Dir: synth.DefaultStoreDir()}

const synthSynopsis = `synth add 'NAME TYPE FIELD; TYPE FIELD; ...'
       synth list
       synth delete NAME
       synth emit [--session NAME] [--cpu N] EVENT FIELD=VALUE ...

Defines synthetic events in the kernel's synthetic_events language: types
u8..u64, s8..s64, char, unsigned char, int, unsigned int, long, unsigned
long, bool, pid_t, gfp_t; char[N] text and char[] strings ('char[16] f' or
'char f[16]'); 'unsigned long[] f', a stack of addresses; and, beyond the
kernel, integer arrays 'u16 f[4]'. They persist until deleted and are
recorded with 'record -e synthetic:NAME'. emit writes one event into a
running session, through the kernel on CPU N (default 0), so it sorts
among kernel events; every field must be given. Stack and array values
are comma-separated (a stack may be empty); bool takes true or false,
char a number or one character. A bad value fails and writes nothing.`

func synthCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("synth", synthSynopsis, "kconsume synth add 'phase u32 n; char[] what; unsigned long[] stack'", stderr)
	var name *string
	var cpu *int
	// emit's flags follow the subcommand: synth emit --session web ...
	if len(args) > 0 && args[0] == "emit" {
		name = fs.String("session", "", "session `name` (default: the one running)")
		cpu = fs.Int("cpu", 0, "inject on this `cpu`")
		args = args[1:]
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if name != nil {
		return synthEmit(*name, *cpu, fs.Args(), stdout)
	}
	if fs.NArg() == 0 {
		return usageError{errors.New("want add, list, delete or emit")}
	}
	rest := fs.Args()[1:]
	switch fs.Arg(0) {
	case "add":
		if len(rest) != 1 {
			return usageError{errors.New("add takes one definition, quoted")}
		}
		e, err := synth.Parse(rest[0])
		if err != nil {
			return usageError{err}
		}
		if err := synthStore.Add(e); err != nil {
			if errors.Is(err, synth.ErrExists) {
				return usageError{err}
			}
			return err
		}
		fmt.Fprintf(stdout, "synthetic:%s\n", e.Name)
		return nil
	case "list":
		if len(rest) != 0 {
			return usageError{errors.New("list takes no arguments")}
		}
		defs, err := synthStore.List()
		if err != nil {
			return err
		}
		for _, e := range defs {
			fmt.Fprintf(stdout, "synthetic:%s\t%s\n", e.Name, e)
		}
		for _, name := range synth.Builtins() {
			fmt.Fprintf(stdout, "synthetic:%s\t%s\t(built in)\n", name, synth.Builtin(name))
		}
		return nil
	case "delete":
		if len(rest) != 1 {
			return usageError{errors.New("delete takes one name")}
		}
		err := synthStore.Delete(strings.TrimPrefix(rest[0], consumer.SynthSystem+":"))
		if errors.Is(err, synth.ErrNotFound) {
			return usageError{err}
		}
		return err
	}
	return usageError{fmt.Errorf("unknown synth command %q: want add, list, delete or emit", fs.Arg(0))}
}

// emitRequest is the argument of the control command emit.
type emitRequest struct {
	Event  string      `json:"event"`
	Fields [][2]string `json:"fields"`
}

func synthEmit(name string, cpu int, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return usageError{errors.New("emit needs an event and its fields")}
	}
	req := emitRequest{Event: strings.TrimPrefix(args[0], consumer.SynthSystem+":")}
	for _, kv := range args[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return usageError{fmt.Errorf("%q: want FIELD=VALUE", kv)}
		}
		req.Fields = append(req.Fields, [2]string{k, v})
	}
	if name == "" {
		names, err := control.Sessions(controlRoot)
		if err != nil {
			return err
		}
		if len(names) != 1 {
			return usageError{fmt.Errorf("%d sessions running: name one with --session", len(names))}
		}
		name = names[0]
	}
	arg, _ := json.Marshal(req)
	out, err := control.Send(controlRoot, name, "emit", cpu, string(arg))
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, out)
	return nil
}

// emit builds and injects the event of an emit request: fields by name,
// every one required, each set once.
func emit(s *consumer.Session, cpu int, arg string) (string, error) {
	var req emitRequest
	if err := json.Unmarshal([]byte(arg), &req); err != nil {
		return "", fmt.Errorf("emit: bad request: %w", err)
	}
	e := s.Synth(req.Event)
	if e == nil && req.Event == synth.Klog {
		e = synth.Builtin(synth.Klog) // declared by EmitSynth at its first use
	}
	if e == nil {
		return "", fmt.Errorf("synthetic:%s is not recorded by this session (record -e synthetic:%s)", req.Event, req.Event)
	}
	if cpu < 0 {
		cpu = 0
	}
	b := e.Start()
	for _, kv := range req.Fields {
		i := e.Field(kv[0])
		if i < 0 {
			return "", fmt.Errorf("synthetic:%s has no field %q (fields: %s)", req.Event, kv[0], e)
		}
		v, err := synth.ParseValue(e.Fields[i], kv[1])
		if err != nil {
			return "", err
		}
		if err := b.Set(kv[0], v); err != nil {
			return "", err
		}
	}
	payload, err := b.End(nil)
	if err != nil {
		return "", err
	}
	if err := s.EmitSynth(cpu, req.Event, payload); err != nil {
		return "", err
	}
	return "", nil
}

// synthDefs returns the stored definitions plus those of file (if any).
// A name defined differently in both is a clash.
func synthDefs(file string) ([]*synth.Event, error) {
	defs, err := synthStore.List()
	if err != nil {
		return nil, err
	}
	if file == "" {
		return defs, nil
	}
	more, err := synth.LoadFile(file)
	if err != nil {
		return nil, usageError{err}
	}
	stored := map[string]*synth.Event{}
	for _, d := range defs {
		stored[d.Name] = d
	}
	for _, m := range more {
		d, ok := stored[m.Name]
		switch {
		case !ok:
			defs = append(defs, m)
		case d.String() != m.String():
			return nil, usageError{fmt.Errorf("%s: %w: %s is stored as %q", file, synth.ErrExists, m.Name, d.String())}
		}
	}
	return defs, nil
}
