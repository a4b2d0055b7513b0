package pgtest

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy in front of a server that can lose a reply: once armed with
// DropReplyAfter, the first server reply to arrive after a client message containing the marker
// is not forwarded, and both connections are closed, as when a network fails after the server
// committed. With DropEveryReply every reply to such a message is lost. HangExisting makes the
// connections open now carry nothing either way, as across a dead route.
type Proxy struct {
	server   int
	listener net.Listener

	mu         sync.Mutex
	marker     []byte
	every      bool
	dropped    int
	generation int
	hungUpTo   int
	orphan     bool
	orphans    []net.Conn
}

// NewProxy listens on port (of the suite's range) in front of the server's; closed when the test
// ends.
func NewProxy(t testing.TB, port, server int) *Proxy {
	t.Helper()
	listener, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{server: server, listener: listener, hungUpTo: -1}
	t.Cleanup(func() { listener.Close() })
	go p.accept()
	return p
}

func (p *Proxy) Port() int { return p.listener.Addr().(*net.TCPAddr).Port }

// DropReplyAfter loses the reply to the next client message that contains marker.
func (p *Proxy) DropReplyAfter(marker string) { p.locked(func() { p.marker = []byte(marker) }) }

// DropEveryReply keeps losing the replies to messages with the marker, not only the next one.
func (p *Proxy) DropEveryReply(every bool) { p.locked(func() { p.every = every }) }

// HangExisting: the connections open now stop carrying data either way (no reset, no answer);
// connections made later work.
func (p *Proxy) HangExisting() { p.locked(func() { p.hungUpTo = p.generation - 1 }) }

// Orphan: a lost reply closes the client's side only; the server's session lives on, as across
// a partition, until CloseOrphans.
func (p *Proxy) Orphan() { p.locked(func() { p.orphan = true }) }

// CloseOrphans closes the server sides Orphan left open.
func (p *Proxy) CloseOrphans() {
	p.locked(func() {
		for _, server := range p.orphans {
			server.Close()
		}
		p.orphans = nil
	})
}

// Dropped is how many replies were lost.
func (p *Proxy) Dropped() (n int) {
	p.locked(func() { n = p.dropped })
	return n
}

func (p *Proxy) locked(do func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	do()
}

func (p *Proxy) accept() {
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", p.server))
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		made := p.generation
		p.generation++
		p.mu.Unlock()
		pair := &pair{proxy: p, client: client, server: server, made: made}
		go pair.pump(client, server, true)
		go pair.pump(server, client, false)
	}
}

// pair is a client's connection and the server's it is proxied to.
type pair struct {
	proxy          *Proxy
	client, server net.Conn
	made           int
	armed          bool // a message with the marker went up: the next reply is lost
}

func (c *pair) pump(from, to net.Conn, upstream bool) {
	defer c.client.Close()
	defer func() {
		p := c.proxy
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.orphan && c.armed {
			p.orphans = append(p.orphans, c.server)
			return
		}
		c.server.Close()
	}()
	buffer := make([]byte, 65536)
	for {
		n, err := from.Read(buffer)
		if err != nil {
			return
		}
		p := c.proxy
		p.mu.Lock()
		hung := c.made <= p.hungUpTo
		lose := false
		switch {
		case hung:
		case upstream && p.marker != nil && bytes.Contains(buffer[:n], p.marker):
			c.armed = true
			if !p.every {
				p.marker = nil
			}
		case !upstream && c.armed:
			p.dropped++
			lose = true
		}
		p.mu.Unlock()
		if lose {
			return
		}
		if hung {
			continue // swallowed: the route is dead
		}
		if _, err := to.Write(buffer[:n]); err != nil {
			return
		}
	}
}
