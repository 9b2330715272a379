package relayd

import "github.com/kconsume/kconsume/relayfmt"

// Tee writes a channel to a local sink and streams it to relayd. The
// local copy decides: its errors are the Tee's errors. relayd's are not:
// after a network failure recording goes on locally while the Sink counts
// every packet it could not send (Sink.Stats).
type Tee struct {
	Local  relayfmt.Sink
	Remote relayfmt.Sink // a *Sink, which counts what it could not send
}

// WriteMetadata writes text locally and sends it to relayd; it returns
// the local error only.
func (t *Tee) WriteMetadata(text []byte) error {
	err := t.Local.WriteMetadata(text)
	_ = t.Remote.WriteMetadata(text)
	return err
}

// WritePacket writes packet locally and sends it to relayd; it returns
// the local error only.
func (t *Tee) WritePacket(name string, packet []byte) error {
	err := t.Local.WritePacket(name, packet)
	_ = t.Remote.WritePacket(name, packet)
	return err
}

// WriteFinal ends stream name of the local copy with packets after its
// failure (relayfmt.FinalSink); relayd is not told: the local copy
// decides. It returns the local sink's error.
func (t *Tee) WriteFinal(name string, packets ...[]byte) error {
	return relayfmt.WriteFinal(t.Local, name, packets...)
}

// Reserve sets room aside in the local copy (relayfmt.Reserver) and
// returns its error.
func (t *Tee) Reserve(names []string, packetSize int) error {
	return relayfmt.Reserve(t.Local, names, packetSize)
}

// Close closes both; it returns the local error only (the remote Sink's
// Stats say what relayd missed).
func (t *Tee) Close() error {
	err := t.Local.Close()
	_ = t.Remote.Close()
	return err
}
