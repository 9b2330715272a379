package relayd

import (
	"fmt"
	"time"
)

// A packet counts as sent once relayd confirms it has the packet's data
// and index (data pending, Stats.Sent): what the sink wrote into a
// socket may still be lost with the connection.

// Packets go out faster than relayd's confirmation comes back; every
// confirmEvery packets or confirmAfter, whichever comes first, the sink
// asks relayd whether it has those sent before the previous check, one
// round trip, so that a relayd killed or cut off later takes at most the
// packets since then with it, and they are counted.
const (
	confirmEvery = 8
	confirmAfter = 250 * time.Millisecond
)

// check asks relayd, every confirmEvery packets or confirmAfter, whether
// it has st's packets sent before the previous check, and confirms them
// if so. A network error stops the sink: the packet that was just sent
// went out, and the failure settles it. The caller holds st.mu.
func (s *Sink) check(c *Client, st *stream) {
	if st.next-st.mark < confirmEvery && time.Since(st.markAt) < confirmAfter {
		return
	}
	if st.mark > st.confirmed {
		pending, err := c.DataPending(st.handle, st.mark-1)
		if err != nil {
			s.fail(c, err)
			return
		}
		if !pending {
			st.confirm(st.mark)
		}
	}
	st.mark, st.markAt = st.next, time.Now()
}

// confirm records that relayd has st's packets before have.
func (st *stream) confirm(have uint64) {
	st.unconfirmed = st.unconfirmed[have-st.confirmed:]
	st.confirmed = have
}

// received returns how many of st's packets relayd has, from its first
// on: data pending is false for each packet up to the last relayd has,
// so a binary search over the unconfirmed ones finds it. It fails when
// relayd cannot be asked.
func (st *stream) received(c *Client) (uint64, error) {
	lo, hi := st.confirmed, st.next
	for lo < hi {
		mid := lo + (hi-lo)/2
		pending, err := c.DataPending(st.handle, mid)
		if err != nil {
			return st.confirmed, err
		}
		if pending {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, nil
}

// settle counts st's packets that relayd has not confirmed as not sent:
// it never will, because the session failed or closed. The caller holds
// st.mu.
func (s *Sink) settle(st *stream) {
	var n, bytes uint64
	for _, size := range st.unconfirmed {
		if size >= 0 {
			n++
			bytes += uint64(size)
		}
	}
	s.sent.Add(-n)
	s.bytes.Add(-bytes)
	s.notSent.Add(n)
	st.confirmed, st.unconfirmed = st.next, nil
}

// settleAll settles every stream of a session that ended.
func (s *Sink) settleAll(streams []*stream) {
	for _, st := range streams {
		st.mu.Lock()
		s.settle(st)
		st.mu.Unlock()
	}
}

// drain waits until relayd has the data and index of every packet it
// confirmed, polling each stream.
func (s *Sink) drain(c *Client, streams []*stream) error {
	deadline := time.Now().Add(c.timeout)
	for _, st := range streams {
		if st.next == 0 {
			continue
		}
		for {
			pending, err := c.DataPending(st.handle, st.next-1)
			if err != nil {
				return err
			}
			if !pending {
				st.mu.Lock()
				st.confirm(st.next)
				st.mu.Unlock()
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("stream %s: relayd still misses data after %v", st.name, c.timeout)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}
