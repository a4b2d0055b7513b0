package pgfence

// LossReason is why a lease was lost, by the names the server and the other clients use. It is
// what the server's lease_status says once the server said the lease is not held (PF001, a
// release that found nothing), or Unreachable when the holder's own deadline passed with no
// answer.
type LossReason string

const (
	// ReasonExpired: its TTL ran out without a renewal, and nobody has been granted the key since.
	ReasonExpired LossReason = "expired"
	// ReasonRevoked: fence.lease_revoke ended it.
	ReasonRevoked LossReason = "revoked"
	// ReasonTakenOver: its TTL ran out and another holder was granted the key.
	ReasonTakenOver LossReason = "taken_over"
	// ReasonSessionEnded: a session-bound lease whose session ended, or was lost to this client.
	ReasonSessionEnded LossReason = "session_ended"
	// ReasonRestarted: a fast lease lost in a crash or a failover of the server. The server
	// cannot tell it from a token it never saw (it says unknown); a client that acquired the
	// lease fast can.
	ReasonRestarted LossReason = "restarted"
	// ReasonUnreachable: the local deadline passed with no answer from the server, which may
	// still count the lease live, for a moment.
	ReasonUnreachable LossReason = "unreachable"
	// ReasonUnknown: the server knows no more (the lease's row is gone).
	ReasonUnknown LossReason = "unknown"
)

// State is where a kept lease stands. Once it leaves StateHeld it never comes back.
type State string

const (
	StateHeld State = "held"
	// StateLost: the server said the token no longer holds the lease; someone else may hold it.
	StateLost State = "lost"
	// StateUnknown: the local deadline passed without a renewal (or a release got no answer):
	// the server may still count it held, but the holder cannot know, so it must stop.
	StateUnknown State = "unknown"
	// StateReleased: ended by its holder, and the server said so.
	StateReleased State = "released"
)

// ended is how the server says a lease ended: released with its token (by an earlier try of
// the holder's own release whose answer was lost), or lost for a reason.
type ended struct {
	released bool
	reason   LossReason
}

// endedOf reads the first ended row of lease_status's (state, reason) rows, a lease's one or a
// set's in key order; nil when every one is live. "unknown" of a fast lease is Restarted.
func endedOf(rows [][2]string, durable bool) *ended {
	for _, row := range rows {
		if row[0] != "ended" {
			continue
		}
		switch reason := LossReason(row[1]); reason {
		case "released":
			return &ended{released: true, reason: ReasonUnknown}
		case ReasonExpired, ReasonRevoked, ReasonTakenOver, ReasonSessionEnded, ReasonRestarted:
			return &ended{reason: reason}
		}
		if durable {
			return &ended{reason: ReasonUnknown}
		}
		return &ended{reason: ReasonRestarted}
	}
	return nil
}
