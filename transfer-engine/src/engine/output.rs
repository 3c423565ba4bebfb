//! The engine's outputs: frames to send (control first, then data by class and round-robin), timers
//! and events.

use std::time::Instant;

use crate::receiver::ReceiverSession;
use crate::scheduler::{Scheduler, ShapingConfig};
use crate::sender::SenderSession;
use crate::{Body, Error, Event, TrafficClass, Transmit};

use super::Engine;

impl Engine {
    /// The next frame to send: control frames first, then data by traffic class (strict priority),
    /// round-robin between sessions of a class so packetized transfers interleave.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if let Some(t) = self.control_out.pop_front() {
            if let Some(queued) = self.replies_queued.get_mut(&t.peer) {
                *queued -= 1;
                if *queued == 0 {
                    self.replies_queued.remove(&t.peer);
                }
            }
            return Some(t);
        }
        while let Some(key) = self.rx_output.pop_front() {
            if let Some(rx) = self.receivers.get_mut(&key)
                && let Some(t) = rx.poll_transmit()
            {
                if rx.has_output() {
                    self.rx_output.push_front(key);
                } else if rx.is_done() {
                    self.retire_receiver(key);
                }
                return Some(t);
            }
        }
        self.shaping_wake = None;
        for class in self.scheduler.order(now) {
            if !self.senders.values().any(|s| s.class() == class) {
                self.scheduler.mark_idle(class);
                continue;
            }
            if let Some(at) = self.scheduler.ready_at(now, class) {
                self.scheduler.mark_waiting(now, class);
                self.shaping_wake = Some(self.shaping_wake.map_or(at, |w| w.min(at)));
                continue;
            }
            if let Some(t) = self.poll_class(now, class) {
                if let Body::Payload(p) = &t.body {
                    self.scheduler.charge(now, class, u64::from(p.len));
                }
                for lower in TrafficClass::ALL.into_iter().filter(|c| *c > class) {
                    self.scheduler.mark_waiting(now, lower);
                }
                return Some(t);
            }
            self.scheduler.mark_idle(class);
        }
        None
    }

    /// Offers a turn to each sending session of `class`, round-robin, until one has a frame.
    fn poll_class(&mut self, now: Instant, class: TrafficClass) -> Option<Transmit> {
        let mut ctx = session_ctx!(self);
        let mut found = None;
        let mut done = None;
        for _ in 0..self.ready.len() {
            let Some(id) = self.ready.pop_front() else {
                break;
            };
            let Some(sender) = self.senders.get_mut(&id) else {
                continue;
            };
            self.ready.push_back(id);
            if sender.class() != class {
                continue;
            }
            found = sender.poll_transmit(now, &mut ctx);
            if sender.is_done() {
                done = Some(id);
            }
            if found.is_some() {
                break;
            }
        }
        if let Some(id) = done {
            self.retire_sender(id);
        }
        found
    }

    /// Changes traffic shaping at run time: link rate, KV share, per-class rates, bursts, starvation limit.
    pub fn set_shaping(&mut self, cfg: ShapingConfig) -> Result<(), Error> {
        self.scheduler = Scheduler::new(cfg)?;
        Ok(())
    }

    /// The shaping in force.
    #[must_use]
    pub fn shaping(&self) -> &ShapingConfig {
        self.scheduler.config()
    }

    /// When [`Engine::handle_timeout`] should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let senders = self
            .senders
            .values()
            .filter_map(SenderSession::next_timeout);
        let receivers = self.receivers.values().map(ReceiverSession::next_timeout);
        senders.chain(receivers).chain(self.shaping_wake).min()
    }

    /// The next event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}
