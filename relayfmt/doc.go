// Package relayfmt is kconsume's trace file format: relay-style channels of
// per-CPU buffers split into fixed-size sub-buffers, each sub-buffer a
// CTF 1.8 packet, so babeltrace2 reads the traces directly.
//
// The writer side is Channel (Write, Discard, Flush, Reset, Snapshot,
// Close) with a Sink (DirSink writes a trace directory); a writer that
// may take events back uses Append, Mark and Undo, and a loop writing
// many events a Run, whose Put is inlined. The reader side is
// Open, StreamReader and Merger, which check every offset against the file
// and return errors naming the file and byte offset. Recover cuts
// crash-damaged stream files back to their last whole packet.
//
// FORMAT.md in this directory specifies the format for other readers.
// The package uses only the standard library.
package relayfmt
