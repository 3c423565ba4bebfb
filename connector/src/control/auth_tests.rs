//! The control handshake's refusals: wrong secret, no secret, wrong namespace, a replayed handshake.

use tokio::io::{DuplexStream, ReadHalf, WriteHalf};

use super::*;

fn id(secret: Option<&str>, ns: u64, engines: &[u32]) -> ControlIdentity {
    ControlIdentity {
        secret: secret.map(Secret::from),
        ns,
        engines: engines.to_vec(),
    }
}

type Halves = (ReadHalf<DuplexStream>, WriteHalf<DuplexStream>);

fn pipe() -> (Halves, Halves) {
    let (a, b) = tokio::io::duplex(1 << 16);
    (tokio::io::split(a), tokio::io::split(b))
}

/// Both halves of one handshake: (the consumer's outcome, the producer's).
async fn handshake(
    consumer_id: &ControlIdentity,
    producer_id: &ControlIdentity,
) -> (Result<(), String>, Result<Consumer, String>) {
    let ((mut cr, mut cw), (mut pr, mut pw)) = pipe();
    // Each side hangs up when done (both halves dropped), as the client and server do.
    let (c, p) = tokio::join!(
        async move { consumer(&mut cr, &mut cw, consumer_id).await },
        async move {
            {
                let hello = frame::read(&mut pr).await.unwrap().unwrap();
                producer(hello, &mut pr, &mut pw, producer_id).await
            }
        },
    );
    (c, p)
}

#[tokio::test]
async fn the_same_secret_and_namespace_pass_and_the_producer_learns_the_engines() {
    let (c, p) = handshake(&id(Some("s"), 7, &[3, 4]), &id(Some("s"), 7, &[])).await;
    c.unwrap();
    assert_eq!(p.unwrap().engines, vec![3, 4]);
    let (c, p) = handshake(&id(None, 7, &[3]), &id(None, 7, &[])).await;
    c.unwrap();
    assert_eq!(p.unwrap().engines, vec![3]);
}

#[tokio::test]
async fn a_wrong_secret_is_refused_on_both_sides() {
    let (c, p) = handshake(&id(Some("mine"), 7, &[3]), &id(Some("theirs"), 7, &[])).await;
    let c = c.unwrap_err();
    assert!(
        c.contains("producer failed shared-secret authentication"),
        "{c}"
    );
    let p = p.unwrap_err();
    assert!(p.contains("auth"), "{p}");
}

#[tokio::test]
async fn one_side_without_a_secret_is_refused_and_told_why() {
    let (c, p) = handshake(&id(None, 7, &[3]), &id(Some("s"), 7, &[])).await;
    let (c, p) = (c.unwrap_err(), p.unwrap_err());
    for why in [&c, &p] {
        assert!(
            why.contains(
                "the producer authenticates with a shared secret and the consumer has none"
            ),
            "{why}"
        );
    }
    let (c, p) = handshake(&id(Some("s"), 7, &[3]), &id(None, 7, &[])).await;
    for why in [c.unwrap_err(), p.unwrap_err()] {
        assert!(
            why.contains(
                "the consumer authenticates with a shared secret and the producer has none"
            ),
            "{why}"
        );
    }
}

#[tokio::test]
async fn another_namespace_is_refused() {
    let (c, p) = handshake(&id(Some("s"), 7, &[3]), &id(Some("s"), 8, &[])).await;
    let (c, p) = (c.unwrap_err(), p.unwrap_err());
    assert!(p.contains("namespace mismatch"), "{p}");
    assert!(c.contains("namespace mismatch"), "{c}");
}

#[tokio::test]
async fn a_request_before_the_hello_is_refused() {
    let ((mut cr, mut cw), (mut pr, mut pw)) = pipe();
    let lookup = Request::Lookup {
        ns: 7,
        tp: crate::tp::RankKv {
            tp: crate::tp::TpRank::SINGLE,
            mla: false,
        },
        whole: false,
    };
    frame::write(&mut cw, &lookup, &[]).await.unwrap();
    let first = frame::read(&mut pr).await.unwrap().unwrap();
    let why = producer(first, &mut pr, &mut pw, &id(None, 7, &[]))
        .await
        .unwrap_err();
    assert!(why.contains("first frame must be a hello"), "{why}");
    let told = frame::read(&mut cr).await.unwrap().unwrap();
    assert!(reply_of(&told).unwrap_err().contains("hello"));
}

#[tokio::test]
async fn a_recorded_handshake_replayed_to_a_new_challenge_fails() {
    // An eavesdropper records an honest consumer's hello and auth ...
    let ((mut cr, mut cw), (mut pr, mut pw)) = pipe();
    let honest = id(Some("s"), 7, &[3]);
    let (c, p) = tokio::join!(consumer(&mut cr, &mut cw, &honest), async {
        let hello = frame::read(&mut pr).await.unwrap().unwrap();
        let mut echo = (&mut pr, &mut pw);
        // ... by standing in for the producer, with the secret (the worst case: the recording
        // is of a real exchange).
        let nonce_p = nonce().unwrap();
        let t = transcript(&hello.head, &hello.keys[0], &nonce_p);
        let mac_p = BlockHash(auth_mac(Some(b"s"), PRODUCER, &t));
        let challenge = Reply::Challenge {
            authenticated: true,
        };
        frame::write(&mut echo.1, &challenge, &[nonce_p, mac_p])
            .await
            .unwrap();
        let auth = frame::read(&mut echo.0).await.unwrap().unwrap();
        frame::write(&mut echo.1, &Reply::Welcome, &[])
            .await
            .unwrap();
        (hello, auth)
    });
    c.unwrap();
    let (hello, auth) = p;
    // Replayed to a producer, whose challenge carries a nonce of its own: the old MAC does not verify.
    let ((mut rr, mut rw), (mut pr, mut pw)) = pipe();
    let producer_id = id(Some("s"), 7, &[]);
    let producer_side = async {
        let hello = frame::read(&mut pr).await.unwrap().unwrap();
        producer(hello, &mut pr, &mut pw, &producer_id).await
    };
    let replay = async {
        frame::write_raw(&mut rw, &hello.head, &hello.keys)
            .await
            .unwrap();
        let _challenge = frame::read(&mut rr).await.unwrap().unwrap();
        frame::write_raw(&mut rw, &auth.head, &auth.keys)
            .await
            .unwrap();
    };
    let (refused, ()) = tokio::join!(producer_side, replay);
    let why = refused.unwrap_err();
    assert!(
        why.contains("consumer failed shared-secret authentication"),
        "{why}"
    );
}
