package broker

import (
	"net"
	"sync/atomic"
	"time"
)

// Eviction. The broker holds at most MaxConns worker connections and
// MaxBufferedBytes of their requests. A workload could fill either with
// connections that send nothing or send a body a byte at a time, and so
// lock out its own (or another process's) legitimate requests until the
// read timeout. Instead, when a new connection arrives at MaxConns, or a
// request cannot get its share of the memory budget, the broker closes a
// connection that is doing nothing useful:
//
//  1. at MaxConns, the connection idle longest (connected, or kept alive,
//     with no request arriving, for more than idleGrace); else the
//     connection whose request has been arriving longest (the slowest
//     upload);
//  2. for memory, the connections whose requests started arriving before
//     the one that needs the memory and still hold a share of it, oldest
//     first.
//
// A connection whose request was read and is being handled (admitted,
// forwarded, streamed) is never evicted. An evicted request that was
// arriving is refused (reason "evicted") and journaled like any refusal;
// an evicted idle connection is just closed, as a server may close an idle
// keep-alive connection. So there is always room to read and admit a new
// request unless MaxConns requests are being handled at once.

// ReasonEvicted refuses a request that was still arriving when the broker
// needed its connection or its memory for another.
const ReasonEvicted Reason = "evicted"

// Phases of a worker connection.
const (
	phaseIdle    int32 = iota // waiting for a request's first byte
	phaseReading              // a request is arriving
	phaseBusy                 // a request is being handled: never evicted
	phaseEvicted              // closed to make room
)

// connState is what eviction knows of one connection.
type connState struct {
	c     net.Conn
	phase atomic.Int32
	since atomic.Int64 // UnixNano when the current phase began
	held  atomic.Int64 // bytes of the memory budget the connection holds
}

func newConnState(c net.Conn) *connState {
	s := &connState{c: c}
	s.since.Store(time.Now().UnixNano())
	return s
}

// enter moves the connection from phase from to phase to; false when it
// was evicted meanwhile.
func (s *connState) enter(from, to int32) bool {
	now := time.Now().UnixNano()
	if !s.phase.CompareAndSwap(from, to) {
		return false
	}
	if to != phaseBusy { // busy keeps the time its request began to arrive
		s.since.Store(now)
	}
	return true
}

func (s *connState) evicted() bool { return s.phase.Load() == phaseEvicted }

// evictLocked closes s if it is still in phase from. b.mu must be held.
func (b *Broker) evictLocked(s *connState, from int32) bool {
	if !s.phase.CompareAndSwap(from, phaseEvicted) {
		return false
	}
	delete(b.conns, s.c)
	s.c.Close()
	return true
}

// idleGrace is how long a connection may be idle before it counts as idle
// for eviction. A connection that was just accepted is idle until its
// first byte is read; within the grace it ranks with the arriving
// requests, as the newest, so that a fast new request is not evicted by
// the next connection before its first byte is read.
const idleGrace = 250 * time.Millisecond

// makeRoomLocked evicts one connection to admit a new one: the one idle
// longest (past idleGrace), else the one whose request has been arriving
// longest. It reports false when every connection is handling a request.
// b.mu must be held.
func (b *Broker) makeRoomLocked() bool {
	for {
		now := time.Now().UnixNano()
		var idle, arriving *connState
		var idlePhase, arrivingPhase int32
		for _, s := range b.conns {
			phase, since := s.phase.Load(), s.since.Load()
			switch {
			case phase == phaseIdle && now-since > int64(idleGrace):
				if idle == nil || since < idle.since.Load() {
					idle, idlePhase = s, phase
				}
			case phase == phaseIdle || phase == phaseReading:
				if arriving == nil || since < arriving.since.Load() {
					arriving, arrivingPhase = s, phase
				}
			}
		}
		victim, from := idle, idlePhase
		if victim == nil {
			victim, from = arriving, arrivingPhase
		}
		if victim == nil {
			return false
		}
		if b.evictLocked(victim, from) {
			b.evictions.Add(1)
			return true
		}
		// It changed phase meanwhile; look again.
	}
}

// evictForMemory evicts connections whose requests began arriving before
// self's and still hold memory, oldest first, until they hold at least n
// bytes between them. It reports whether it evicted any; their goroutines
// then release what they held.
func (b *Broker) evictForMemory(self *connState, n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	start := self.since.Load()
	var freed int64
	any := false
	for freed < n {
		var oldest *connState
		for _, s := range b.conns {
			if s != self && s.phase.Load() == phaseReading && s.held.Load() > 0 && s.since.Load() < start &&
				(oldest == nil || s.since.Load() < oldest.since.Load()) {
				oldest = s
			}
		}
		if oldest == nil {
			break
		}
		h := oldest.held.Load()
		if b.evictLocked(oldest, phaseReading) {
			b.evictions.Add(1)
			freed += h
			any = true
		}
	}
	return any
}
