package pgfence

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ApplicationName is set on connections whose config has none, so that a holder's backends can
// be found in pg_stat_activity.
const ApplicationName = "pg_fence_client"

// ParsePoolConfig is pgxpool.ParseConfig tuned for holding leases: an application_name (unless
// the string sets one), a 10 s connect timeout (unless it sets one), and TCP keepalives that give
// up on a silent peer (a dead host, a dropped route) within 10 + 3 * 2 = 16 s rather than the
// system's minutes; a hung but reachable server is bounded by the calls' timeouts instead.
func ParsePoolConfig(connString string) (*pgxpool.Config, error) {
	config, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	conn := config.ConnConfig
	if _, set := conn.RuntimeParams["application_name"]; !set {
		conn.RuntimeParams["application_name"] = ApplicationName
	}
	if conn.ConnectTimeout == 0 {
		conn.ConnectTimeout = 10 * time.Second
	}
	dialer := &net.Dialer{
		Timeout:         conn.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 2 * time.Second, Count: 3},
	}
	conn.DialFunc = dialer.DialContext
	return config, nil
}

// pooled gives the Client's calls a connection of its pool each.
func pooled(pool *pgxpool.Pool) getConn {
	return func(ctx context.Context) (*pgx.Conn, func(bool), error) {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		return conn.Conn(), func(broken bool) {
			if broken {
				closeQuietly(conn.Conn())
			}
			conn.Release()
		}, nil
	}
}

// ownConn is a connection of a kept lease's own, outside the pool, made from the pool's config:
// a session-bound lease lives exactly as long as the session that took it, and a renewal that
// hung must be tried again on a connection made anew, never on another of the pool's (which may
// hang the same way).
type ownConn struct {
	config *pgx.ConnConfig
	conn   *pgx.Conn
	made   *atomic.Int64 // a keeper's count of the connections it made; nil for a lease's own
}

func (o *ownConn) get(ctx context.Context) (*pgx.Conn, func(bool), error) {
	if o.conn == nil || o.conn.IsClosed() {
		conn, err := pgx.ConnectConfig(ctx, o.config)
		if err != nil {
			return nil, nil, err
		}
		o.conn = conn
		if o.made != nil {
			o.made.Add(1)
		}
	}
	conn := o.conn
	return conn, func(broken bool) {
		if broken {
			o.drop()
		}
	}, nil
}

// drop closes the connection (a broken or hung one); the next get makes another.
func (o *ownConn) drop() {
	if o.conn != nil {
		closeQuietly(o.conn)
		o.conn = nil
	}
}

// closeQuietly closes conn without waiting on a peer that may hang: the Terminate message is
// given a moment, then the socket is closed.
func closeQuietly(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = conn.Close(ctx)
}
