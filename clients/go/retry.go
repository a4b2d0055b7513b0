package pgfence

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Backoff is exponential backoff with full jitter: before retry n (from 0) sleep a uniformly
// random time in [0, min(Cap, Base * 2^n)]. Full jitter spreads clients that failed together (a
// server restart) so that their retries do not arrive together. Retries end after MaxAttempts
// tries or once MaxElapsed has passed since the call's first failure, whichever comes first: the
// time a try took before it failed (an acquire's Wait for the key) is not the retries' time.
//
// The zero value is the default: 50 ms, 2 s, no bound on tries, 30 s of retries; the time is the
// bound, not a number of tries, so that a restart or a failover of several seconds is waited out
// however quickly each try is refused. A negative MaxElapsed is no bound on time.
type Backoff struct {
	Base        time.Duration
	Cap         time.Duration
	MaxAttempts int
	MaxElapsed  time.Duration
}

func (b Backoff) orDefault() Backoff {
	if b.Base <= 0 {
		b.Base = 50 * time.Millisecond
	}
	if b.Cap <= 0 {
		b.Cap = 2 * time.Second
	}
	if b.MaxElapsed == 0 {
		b.MaxElapsed = 30 * time.Second
	}
	return b
}

// Ceiling is the most that retry n sleeps: min(Cap, Base * 2^n).
func (b Backoff) Ceiling(retry int) time.Duration {
	b = b.orDefault()
	ceiling := b.Base
	for range retry {
		if ceiling >= b.Cap {
			break
		}
		ceiling *= 2
	}
	return min(ceiling, b.Cap)
}

// Delay is a random sleep for retry n, within [0, Ceiling(n)].
func (b Backoff) Delay(retry int) time.Duration {
	return time.Duration(rand.Int64N(int64(b.Ceiling(retry)) + 1))
}

// next is the sleep before the next try, after tries tries, the first failure at failed; false
// when the retries ran out.
func (b Backoff) next(tries int, failed time.Time) (time.Duration, bool) {
	b = b.orDefault()
	if b.MaxAttempts > 0 && tries >= b.MaxAttempts {
		return 0, false
	}
	delay := b.Delay(tries - 1)
	if b.MaxElapsed > 0 && time.Since(failed)+delay >= b.MaxElapsed {
		return 0, false
	}
	return delay, true
}

// getConn gives a connection for one try, and what to do with it after: a broken connection is
// closed, never used again.
type getConn func(ctx context.Context) (conn *pgx.Conn, done func(broken bool), err error)

// retry is how a call that failed is tried again.
type retry struct {
	get     getConn
	backoff Backoff
	limit   time.Duration // bounds each try: a server that hangs must not hang the caller
	// resend false: a try that may have taken effect is not sent again (lease_acquire_all, whose
	// token the server draws, cannot be asked again for the set it may have granted).
	resend bool
	token  uuid.UUID // an acquire's, for the *OutcomeUnknownError
}

// retrying runs call until it succeeds, fails for good (a server error), or the retries run out.
// A failed connection, a try that timed out, and the server ending the session are retried, on a
// new connection, after a sleep of full jitter. Once one try may have taken effect, running out
// of retries (or the caller's context ending) leaves the outcome unknown.
func retrying[T any](ctx context.Context, r retry, call func(context.Context, *pgx.Conn) (T, error)) (T, error) {
	var zero T
	// The retries' time counts from the first failure, not from the call: an acquire that waited
	// its Wait before its session ended still has all of MaxElapsed to retry.
	var failed time.Time
	unsure, connected := false, false
	for tries := 1; ; tries++ {
		value, err, sent := tryOnce(ctx, r, call)
		if err == nil {
			return value, nil
		}
		connected = connected || sent
		unsure = unsure || (sent && mayHaveTakenEffect(err))
		if ctx.Err() == nil && sent && !retryable(err) {
			return zero, err
		}
		if failed.IsZero() {
			failed = time.Now()
		}
		delay, more := r.backoff.next(tries, failed)
		if ctx.Err() != nil || !more || (unsure && !r.resend) || !sleep(ctx, delay) {
			switch {
			case unsure:
				return zero, &OutcomeUnknownError{Token: r.token, Err: err}
			case !connected && ctx.Err() == nil:
				return zero, fmt.Errorf("%w: %w", ErrNoConnection, err)
			}
			return zero, err
		}
	}
}

// tryOnce is one try; sent is false when it failed before anything was sent (no connection).
func tryOnce[T any](ctx context.Context, r retry, call func(context.Context, *pgx.Conn) (T, error)) (value T, err error, sent bool) {
	conn, done, err := r.get(ctx)
	if err != nil {
		return value, err, false
	}
	// A try given up on closes its connection (pgx does, mid-statement), and the server, which
	// watches the socket while a statement waits, ends the statement: a waiting acquire leaves its
	// queue rather than be granted a lease nobody will hear of.
	tryCtx, cancel := context.WithTimeout(ctx, r.limit)
	defer cancel()
	value, err = call(tryCtx, conn)
	if err != nil && tryCtx.Err() != nil && ctx.Err() == nil {
		err = fmt.Errorf("pgfence: no answer within %v: %w", r.limit, errTimedOut)
	}
	done(err != nil && retryable(err))
	return value, err, true
}

// errTimedOut: a try abandoned at its limit, which may have taken effect.
var errTimedOut = fmt.Errorf("pgfence: try timed out")

// sleep sleeps d, or less if ctx ends first: whether it slept it all.
func sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}
