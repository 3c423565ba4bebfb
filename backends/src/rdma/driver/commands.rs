//! The node's commands to its driver (register, deregister, connect, ...), carried out on the driver
//! thread, and the messages they send at once.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::super::MAX_TAGS;
use super::super::ffi::MrId;
use super::super::message::Message;
use super::super::shared::{Command, LocalRegion, ToRegister, lock};
use super::Driver;
use crate::TransportError;

impl Driver<'_> {
    pub(super) fn commands(&mut self) {
        loop {
            let Some(cmd) = lock(&self.shared.commands).pop_front() else {
                return;
            };
            match cmd {
                Command::Register(memory, reply) => {
                    let registered = match &memory {
                        ToRegister::InPlace(memory) => self.ep.register(memory),
                        ToRegister::Mirror(mirror) => self.ep.register_dma(mirror),
                    };
                    let result = registered.and_then(|(mr, rkey)| {
                        Ok(LocalRegion {
                            mr,
                            rkey,
                            rma_base: self.ep.remote_base(mr)?,
                        })
                    });
                    let _ = reply.send(result);
                }
                Command::Deregister(mr) => self.deregister(mr),
                Command::Connect(name, reply) => {
                    let result = self.ep.insert(&name).and_then(|addr| {
                        self.next_nonce += 1;
                        let nonce = self.next_nonce;
                        let tag = self.assign_tag()?;
                        let hello = Message::Hello {
                            nonce,
                            tag,
                            name: self.shared.name.clone(),
                            segments: self.shared.offered(),
                        };
                        self.send_now(addr, &hello)?;
                        Ok((nonce, addr, tag))
                    });
                    match result {
                        Ok((nonce, addr, tag)) => {
                            self.dialed.insert(nonce, addr);
                            self.connects.insert(nonce, (tag, reply));
                        }
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
            }
        }
    }

    pub(super) fn assign_tag(&mut self) -> Result<u16, TransportError> {
        if self.next_tag >= MAX_TAGS {
            return Err(TransportError::Refused(format!(
                "more than {} peers have connected to this node",
                MAX_TAGS - 1
            )));
        }
        self.next_tag += 1;
        Ok(self.next_tag - 1)
    }

    /// Sends a message, progressing the queue until a slot frees (handshakes only: rare and small).
    pub(super) fn send_now(&mut self, addr: u64, msg: &Message) -> Result<(), TransportError> {
        let bytes = msg.encode(self.shared.engine_id());
        let give_up = Instant::now() + Duration::from_secs(2);
        while !self.ep.send(addr, &bytes)? {
            if Instant::now() > give_up {
                return Err(crate::rdma::own("no send slot frees up"));
            }
            let mut done = Vec::new();
            self.ep.poll(&mut done)?;
            for c in done {
                self.completion(c);
            }
        }
        self.shared
            .counters
            .messages_sent
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Closes a registration, or keeps it to close later while writes from it are in flight (its memory,
    /// a staged region's mirror say, is released only then).
    pub(super) fn deregister(&mut self, mr: MrId) {
        if let Err(e) = self.ep.deregister(mr) {
            if self.ep.is_registered(mr) {
                self.deregister_later.push(mr);
            } else {
                self.shared.failed(None, format!("deregistering: {e}"));
            }
        }
    }
}
