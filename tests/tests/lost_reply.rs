//! An acquire whose reply is lost: the grant committed, and the connection dropped before the
//! client read its reply. Retried with the token the client chose, the acquire returns that same
//! lease; without it, the client could neither use nor release the lease and the key would stay
//! held for the whole TTL.
use pg_fence_integration::Cluster;
use postgres::{Client, NoTls};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use uuid::Uuid;

/// A TCP proxy for one connection to `server_port`. Once `drop_replies` is set, the next bytes the
/// server sends are not passed on: both connections are closed instead.
fn proxy(server_port: u16, drop_replies: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        let (client, _) = listener.accept().unwrap();
        let server = TcpStream::connect(("127.0.0.1", server_port)).unwrap();
        let (mut from_client, mut to_server) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        thread::spawn(move || {
            let _ = std::io::copy(&mut from_client, &mut to_server);
        });
        let (mut from_server, mut to_client) = (server, client);
        let mut buffer = [0u8; 8192];
        while let Ok(n) = from_server.read(&mut buffer) {
            if n == 0 || drop_replies.load(Ordering::SeqCst) {
                break;
            }
            if to_client.write_all(&buffer[..n]).is_err() {
                break;
            }
        }
        let _ = to_client.shutdown(Shutdown::Both);
        let _ = from_server.shutdown(Shutdown::Both);
    });
    port
}

const ACQUIRE: &str = "SELECT fence, token FROM fence.lease_acquire($1, '1 hour', token => $2)";

#[test]
fn a_retried_acquire_with_its_token_gets_the_lease_whose_reply_was_lost() {
    let cluster = Cluster::start("lost_reply", 27411, &[]);
    let drop_replies = Arc::new(AtomicBool::new(false));
    let port = proxy(cluster.port(), drop_replies.clone());
    let mut through_proxy =
        Client::connect(&format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"), NoTls).unwrap();
    // Prepared first, so that the acquire is one round trip whose reply comes after its commit.
    let acquire = through_proxy.prepare(ACQUIRE).unwrap();
    let token = Uuid::from_u128(rand::random());
    drop_replies.store(true, Ordering::SeqCst);
    let lost = through_proxy.query_one(&acquire, &[&"report", &token]);
    assert!(lost.is_err(), "the reply reached the client: {lost:?}");

    let mut client = cluster.connect();
    let granted: Option<i64> = client.query_one("SELECT fence.current_fence('report')", &[]).unwrap().get(0);
    let granted = granted.expect("the lost acquire committed its grant");
    // Without the token the key is held by a lease nobody can use.
    let other: Option<i64> =
        client.query_one(ACQUIRE, &[&"report", &Uuid::from_u128(rand::random())]).unwrap().get(0);
    assert_eq!(other, None);
    // With it, the retry gets that lease: same fence, the caller's token, which renews and releases.
    let retry = client.query_one(ACQUIRE, &[&"report", &token]).unwrap();
    assert_eq!(retry.get::<_, Option<i64>>(0), Some(granted));
    assert_eq!(retry.get::<_, Option<Uuid>>(1), Some(token));
    client.query_one("SELECT fence.lease_renew('report', $1, '1 minute')", &[&token]).unwrap();
    let released: bool =
        client.query_one("SELECT fence.lease_release('report', $1)", &[&token]).unwrap().get(0);
    assert!(released);
}
