//! A control connection's reading half that does not wait on the runtime's readiness alone: while a read
//! is pending it asks the socket itself every [`RECHECK`], so bytes that arrived without the runtime
//! hearing of them (an edge-triggered readiness lost, as seen inside vLLM's worker for the listener, see
//! `server::ACCEPT_RECHECK`) cost at most that long, not the call's whole timeout.

use std::io::{ErrorKind, Read};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;
use tokio::time::Sleep;

/// How long a pending read trusts the runtime before it asks the socket.
pub(crate) const RECHECK: Duration = Duration::from_millis(50);

/// The reading half of a control connection; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct RecheckedRead {
    half: OwnedReadHalf,
    recheck: Option<Pin<Box<Sleep>>>,
}

impl RecheckedRead {
    pub(crate) fn new(half: OwnedReadHalf) -> Self {
        Self {
            half,
            recheck: None,
        }
    }
}

impl AsyncRead for RecheckedRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Poll::Ready(result) = Pin::new(&mut this.half).poll_read(cx, buf) {
            this.recheck = None;
            return Poll::Ready(result);
        }
        loop {
            let timer = this
                .recheck
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(RECHECK)));
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.recheck = None;
            let stream: &TcpStream = this.half.as_ref();
            // The socket is non-blocking (tokio made it so): this read takes what is queued, or says
            // there is nothing.
            match (&*socket2::SockRef::from(stream)).read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn reads_what_arrives_and_the_end_of_the_stream() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (dialed, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (mut dialed, (accepted, _)) = (dialed.unwrap(), accepted.unwrap());
        let (read, _write) = accepted.into_split();
        let mut read = RecheckedRead::new(read);
        dialed.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(10), read.read_exact(&mut got))
            .await
            .expect("the bytes were read")
            .unwrap();
        assert_eq!(&got, b"hello");
        drop(dialed);
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), read.read_to_end(&mut rest))
            .await
            .expect("the end was seen")
            .unwrap();
        assert!(rest.is_empty());
    }

    #[test]
    fn bytes_the_runtime_never_reports_are_read_by_the_recheck() {
        // A socket registered with a runtime whose I/O driver is not polled once the runtime has seen
        // it readable and then empty: bytes sent after that are never reported, as when an edge is
        // lost; the recheck reads them anyway.
        let io_rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (dialed, read) = io_rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (dialed, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
            let (mut dialed, accepted) = (dialed.unwrap(), accepted.unwrap().0);
            dialed.write_all(b"x").await.unwrap();
            accepted.readable().await.unwrap();
            let mut x = [0u8; 1];
            assert_eq!(accepted.try_read(&mut x).unwrap(), 1);
            // Nothing more is queued: the runtime now believes the socket empty until its driver says.
            let empty = accepted.try_read(&mut x).unwrap_err();
            assert_eq!(empty.kind(), ErrorKind::WouldBlock);
            (dialed, accepted.into_split().0)
        });
        let mut dialed = dialed.into_std().unwrap();
        dialed.set_nonblocking(false).unwrap();
        std::io::Write::write_all(&mut dialed, b"late").unwrap();
        let mut read = RecheckedRead::new(read);
        // Timers on a runtime of their own; `io_rt`, which holds the socket's registration, is not
        // polled while this runs.
        let timer_rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let mut got = [0u8; 4];
        timer_rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), read.read_exact(&mut got))
                .await
                .expect("the recheck read the bytes")
                .unwrap();
        });
        assert_eq!(&got, b"late");
        drop(read);
        drop(io_rt);
    }
}
