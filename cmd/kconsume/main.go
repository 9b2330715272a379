// Command kconsume records kernel events into relay-format CTF traces and
// reads them back: record, list, report, stats, recover, version.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/kconsume/kconsume/consumer"
	"github.com/kconsume/kconsume/relayfmt"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

const usage = `usage: kconsume COMMAND [ARGS]

Commands:
  record        record tracepoints into a trace directory (root)
  ctl           drive a running record: start, stop, flush, snapshot, reset, status
  list          list the tracepoints and synthetic events that can be recorded
  synth         define, list, delete synthetic events; emit one into a session
  report DIR    print a trace's events merged by time, losses inline
  stats DIR     count a trace's events and losses per stream and event
  recover DIR   cut crash-damaged stream files back to their last whole packet
  version       print the version

Run 'kconsume COMMAND -h' for a command's flags and an example.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command and returns the exit status: 0 on success,
// 1 when the command failed, 2 for bad usage.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "record":
		err = record(args[1:], stdout, stderr)
	case "list":
		err = list(args[1:], stdout, stderr)
	case "ctl":
		err = ctl(args[1:], stdout, stderr)
	case "synth":
		err = synthCmd(args[1:], stdout, stderr)
	case "stats":
		err = statsCmd(args[1:], stdout, stderr)
	case "report":
		err = report(args[1:], stdout, stderr)
	case "recover":
		err = recoverCmd(args[1:], stdout, stderr)
	case "version":
		fmt.Fprintf(stdout, "kconsume %s (trace format %d)\n", version, relayfmt.FormatVersion)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "kconsume: unknown command %q\n%s", args[0], usage)
		return 2
	}
	var ue usageError
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "kconsume %s: %v\n", args[0], err)
		return 2
	default:
		fmt.Fprintf(stderr, "kconsume %s: %v\n", args[0], err)
		return 1
	}
}

type usageError struct{ error }

func newFlags(name, synopsis, example string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: kconsume %s\n\nExample:\n  %s\n", synopsis, example)
		fs.PrintDefaults()
	}
	return fs
}

// oneDir parses fs and returns its single positional argument.
func oneDir(fs *flag.FlagSet, args []string) (string, error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return "", err
		}
		return "", usageError{err}
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return "", usageError{fmt.Errorf("want one trace directory, got %d arguments", fs.NArg())}
	}
	return fs.Arg(0), nil
}

// appendStamp appends ns as seconds with 9 decimals ("6589.325443713").
func appendStamp(dst []byte, ns uint64) []byte {
	dst = strconv.AppendUint(dst, ns/1e9, 10)
	frac := ns % 1e9
	var buf [10]byte
	buf[0] = '.'
	for i := 9; i > 0; i-- {
		buf[i] = byte('0' + frac%10)
		frac /= 10
	}
	return append(dst, buf[:]...)
}

func recoverCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("recover", "recover DIR", "kconsume recover /tmp/trace && babeltrace2 /tmp/trace", stderr)
	dir, err := oneDir(fs, args)
	if err != nil {
		return err
	}
	res, err := relayfmt.Recover(dir)
	for _, r := range res {
		if r.Cut() {
			fmt.Fprintf(stdout, "%s: cut %d bytes, kept %d whole packets (%d bytes): %s\n", r.File, r.Size-r.Kept, r.Packets, r.Kept, r.Reason)
		} else {
			fmt.Fprintf(stdout, "%s: whole, %d packets\n", r.File, r.Packets)
		}
	}
	if err != nil {
		return err
	}
	killed, err := consumer.RecoverKilled(dir)
	switch {
	case err != nil:
		return err
	case killed == nil:
		return nil
	case killed.Uncounted != "":
		fmt.Fprintf(stdout, "the recording was killed; the events it held then are not counted: %s\n", killed.Uncounted)
		return nil
	}
	var lost, rescued uint64
	for _, k := range killed.Streams {
		if k.Rescued > 0 {
			fmt.Fprintf(stdout, "%s: %d events taken from the recorder's ring and written\n", k.Stream, k.Rescued)
		}
		if k.Lost > 0 {
			fmt.Fprintf(stdout, "%s: %d events the recorder made were lost with the recording, now counted as discarded at the end\n", k.Stream, k.Lost)
		}
		lost += k.Lost
		rescued += k.Rescued
	}
	fmt.Fprintf(stdout, "the recording was killed: %d events it held written from its rings, %d lost with it and counted in the trace\n", rescued, lost)
	return nil
}
