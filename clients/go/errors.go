package pgfence

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// The errors to test for with errors.Is. Those that carry more (the key, the reason, the fence,
// the token) are the types below, for errors.As; a server error behind one stays reachable too:
// errors.As(err, &pgErr) gives its *pgconn.PgError and SQLSTATE. Bad input (22023, 22004, ...),
// a read-only transaction (25006) and the like are left as the server's *pgconn.PgError.
var (
	// ErrLeaseLost: the token no longer holds the key's live lease (PF001, or a kept lease that
	// knows it lost its lease: a *LeaseLostError says why).
	ErrLeaseLost = errors.New("pgfence: lease lost")
	// ErrStaleFence: a fenced write under a fence that is no longer the key's live one (PF002).
	ErrStaleFence = errors.New("pgfence: stale fence")
	// ErrVersionConflict: VersionedUpdate found another version (40001).
	ErrVersionConflict = errors.New("pgfence: version conflict")
	// ErrWaitCancelled: a waiting acquire ended by the server: cancelled or statement_timeout
	// (57014), lock_timeout while queued behind other waiters (55P03). Nothing was granted.
	ErrWaitCancelled = errors.New("pgfence: waiting acquire cancelled")
	// ErrWaitTimedOut: Hold, HoldAll or a campaign was not granted within its wait.
	ErrWaitTimedOut = errors.New("pgfence: not granted within the wait")
	// ErrOutcomeUnknown: the connection failed mid-call and the retries ran out: the call may have
	// taken effect. An *OutcomeUnknownError carries an acquire's token.
	ErrOutcomeUnknown = errors.New("pgfence: outcome unknown")
	// ErrNoConnection: no connection could be made before the retries ran out; nothing was sent.
	ErrNoConnection = errors.New("pgfence: no connection")
	// ErrInvalidOptions: options that cannot work, refused before anything is sent.
	ErrInvalidOptions = errors.New("pgfence: invalid options")
	// ErrNotInTransaction: FenceGuard on a pool, or on a connection outside a transaction block,
	// where it would run in a transaction of its own and protect no write.
	ErrNotInTransaction = errors.New("pgfence: a guard outside a transaction protects nothing")
	// ErrReleased: the cause of a kept lease's Context once its holder released it.
	ErrReleased = errors.New("pgfence: lease released by its holder")
)

// ErrObserverBlind: an observer had no answer from the server by the expiry of the lease it saw;
// an *ObserverBlindError says which.
var ErrObserverBlind = errors.New("pgfence: observer cannot see the key")

// ObserverBlindError is what Observe yields when the server did not answer by the observed
// leader's lease expiry: that leader may be gone, and the observer cannot tell. Observe goes on
// (reconnecting) after it, and its next item is what the server then says, whatever it is.
type ObserverBlindError struct {
	Key  string
	Last *Leader // the leader seen last
	Err  error   // why no answer came
}

func (e *ObserverBlindError) Error() string {
	return fmt.Sprintf("pgfence: observer of %q cannot see it: %v", e.Key, e.Err)
}

func (e *ObserverBlindError) Unwrap() []error { return []error{ErrObserverBlind, e.Err} }

// LeaseLostError is ErrLeaseLost with the key (a set's keys, comma-separated) and why. Reason is
// empty from the one-statement Renew, which does not ask; the Client, a kept lease and the elector
// ask the server's lease_status.
type LeaseLostError struct {
	Key    string
	Reason LossReason
	Err    error // the server's PF001, if that is how it was learnt
}

func (e *LeaseLostError) Error() string {
	why := ""
	if e.Reason != "" {
		why = ": " + string(e.Reason)
	}
	return fmt.Sprintf("pgfence: lease on %q lost%s", e.Key, why)
}

func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }
func (e *LeaseLostError) Unwrap() error        { return e.Err }

// StaleFenceError is ErrStaleFence with the fence that was refused (and the key, when the write
// named one).
type StaleFenceError struct {
	Key   string
	Fence int64
	Err   error
}

func (e *StaleFenceError) Error() string {
	return fmt.Sprintf("pgfence: stale fence %d for %q: the write was refused (PF002)", e.Fence, e.Key)
}

func (e *StaleFenceError) Is(target error) bool { return target == ErrStaleFence }
func (e *StaleFenceError) Unwrap() error        { return e.Err }

// OutcomeUnknownError is ErrOutcomeUnknown; for an acquire, Token is the token every try carried:
// release what it may have granted with ReleaseToken, or ask Status.
type OutcomeUnknownError struct {
	Token uuid.UUID // uuid.Nil for calls other than an acquire
	Err   error     // the last failure
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("pgfence: outcome unknown, the call may have taken effect: %v", e.Err)
}

func (e *OutcomeUnknownError) Is(target error) bool { return target == ErrOutcomeUnknown }
func (e *OutcomeUnknownError) Unwrap() error        { return e.Err }

// sqlstate is the server's SQLSTATE behind err, or "".
func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// The one place server errors become typed ones: PF001 and PF002 need the key and fence of the
// call, which the callers give.
func typed(err error, key string, fence int64) error {
	switch sqlstate(err) {
	case "PF001":
		return &LeaseLostError{Key: key, Err: err}
	case "PF002":
		return &StaleFenceError{Key: key, Fence: fence, Err: err}
	case "40001":
		return fmt.Errorf("%w: %w", ErrVersionConflict, err)
	case "57014", "55P03":
		return fmt.Errorf("%w: %w", ErrWaitCancelled, err)
	}
	return err
}

// retryable: whether trying again, on a new connection, can help. A server error means the
// statement failed and changed nothing, except class 08 and the 57P0x codes (the server ending
// or refusing the session) and 53300 (too many connections); any other driver error is a broken
// connection. The caller's own context ending is never retried.
func retryable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	code := sqlstate(err)
	return code == "" || strings.HasPrefix(code, "08") || strings.HasPrefix(code, "57P0") || code == "53300"
}

// mayHaveTakenEffect: whether the call that failed so may still have happened. pgx says when
// nothing was sent; a 57P0x (terminate, shutdown, crash) can come after the statement's work, as a
// terminate during a commit's wait for a synchronous standby, where the commit stays.
func mayHaveTakenEffect(err error) bool {
	var connect *pgconn.ConnectError
	if errors.As(err, &connect) || pgconn.SafeToRetry(err) {
		return false
	}
	code := sqlstate(err)
	return code == "" || strings.HasPrefix(code, "57P0")
}
