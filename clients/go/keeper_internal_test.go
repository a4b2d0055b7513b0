package pgfence

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The deadline is judged by the clock at each call, whether or not the keeper has run since (a
// process stopped past it, whose keeper has not woken yet).
func TestTheDeadlineIsJudgedByTheClockWithoutTheKeeper(t *testing.T) {
	k := &KeptLease{kept: kept{lease: &Lease{Key: "k"}}, state: StateHeld, deadline: time.Now().Add(50 * time.Millisecond)}
	k.ctx, k.cancel = context.WithCancelCause(context.Background())
	var told []error
	k.onLost = func(cause error) { told = append(told, cause) }
	if !k.IsHeld() || k.Err() != nil {
		t.Fatal("not held before its deadline")
	}
	time.Sleep(60 * time.Millisecond)
	if k.IsHeld() || k.State() != StateUnknown || k.Reason() != ReasonUnreachable {
		t.Fatalf("past its deadline: %s, %s", k.State(), k.Reason())
	}
	var lost *LeaseLostError
	if !errors.As(context.Cause(k.Context()), &lost) || lost.Reason != ReasonUnreachable || len(told) != 1 {
		t.Fatalf("cause %v, told %v", context.Cause(k.Context()), told)
	}
}

// A leadership's Context is judged by the lease's deadline at each call too, as the kept lease's
// is: after this process was stopped past it, before the keeper wakes.
func TestTheLeadershipsContextIsJudgedByTheDeadlineWithoutTheKeeper(t *testing.T) {
	k := &KeptLease{kept: kept{lease: &Lease{Key: "k"}}, state: StateHeld, deadline: time.Now().Add(50 * time.Millisecond)}
	k.ctx, k.cancel = context.WithCancelCause(context.Background())
	l := (&Elector{}).elected(context.Background(), k)
	if l.Context().Err() != nil {
		t.Fatal("ended before its deadline")
	}
	time.Sleep(60 * time.Millisecond)
	var lost *LeaseLostError
	if !errors.As(context.Cause(l.Context()), &lost) || lost.Reason != ReasonUnreachable {
		t.Fatalf("past its deadline: %v", context.Cause(l.Context()))
	}
	<-l.stopped
}
