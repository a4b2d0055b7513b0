//! A TCP proxy in front of a cluster that loses replies and breaks connections on purpose. A cut
//! either closes both sides, or only the client's: then the server side stays open and its backend
//! lives on, orphaned, as after a partition the server has not noticed, until `end_orphans`. A hang
//! leaves both sides open and silent, as across a dead route, until the proxy is dropped.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy)]
pub enum Cut {
    Both,
    ClientSide,
}

#[derive(Default)]
struct State {
    /// The next request containing these bytes has its reply dropped and its connection cut.
    trigger: Mutex<Option<(Vec<u8>, Cut)>>,
    /// Cancelled (and replaced) to cut the client side of the connections open until then.
    sever: Mutex<CancellationToken>,
    /// Cancelled (and replaced) to close the server side of the orphans until then.
    orphans: Mutex<CancellationToken>,
    /// Cancelled (and replaced) to stop the connections open until then carrying data.
    hang: Mutex<CancellationToken>,
    /// Cancelled when the proxy is dropped: the hung connections close then.
    closed: CancellationToken,
    connections: AtomicUsize,
    dropped_bytes: AtomicUsize,
}

pub struct Proxy {
    pub port: u16,
    state: Arc<State>,
}

impl Proxy {
    pub async fn start(server_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let shared = state.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                shared.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(forward(client, server_port, shared.clone()));
            }
        });
        Proxy { port, state }
    }

    pub fn drop_reply_to(&self, request: &str, cut: Cut) {
        *self.state.trigger.lock().unwrap() = Some((request.as_bytes().to_vec(), cut));
    }

    /// Closes the client side of every connection open now; their backends live on.
    pub fn sever(&self) {
        std::mem::take(&mut *self.state.sever.lock().unwrap()).cancel();
    }

    /// Closes the server side of every orphan: their backends end.
    pub fn end_orphans(&self) {
        std::mem::take(&mut *self.state.orphans.lock().unwrap()).cancel();
    }

    /// The connections open now stop carrying data either way, with no reset and no answer; the
    /// ones made later work.
    pub fn hang(&self) {
        std::mem::take(&mut *self.state.hang.lock().unwrap()).cancel();
    }

    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    pub fn dropped_bytes(&self) -> usize {
        self.state.dropped_bytes.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.closed.cancel();
    }
}

impl State {
    fn triggered(&self, request: &[u8]) -> Option<Cut> {
        let mut trigger = self.trigger.lock().unwrap();
        let hit = trigger.as_ref().is_some_and(|(text, _)| request.windows(text.len()).any(|w| w == text));
        hit.then(|| trigger.take().unwrap().1)
    }
}

async fn forward(mut client: TcpStream, server_port: u16, state: Arc<State>) {
    let mut server = TcpStream::connect(("127.0.0.1", server_port)).await.unwrap();
    let sever = state.sever.lock().unwrap().clone();
    let hang = state.hang.lock().unwrap().clone();
    let (mut up, mut down) = ([0u8; 8192], [0u8; 8192]);
    let mut armed = None;
    let cut = loop {
        tokio::select! {
            read = client.read(&mut up) => {
                let n = match read { Ok(n) if n > 0 => n, _ => return };
                armed = armed.or_else(|| state.triggered(&up[..n]));
                if server.write_all(&up[..n]).await.is_err() { return }
            }
            read = server.read(&mut down) => {
                let n = match read { Ok(n) if n > 0 => n, _ => return };
                if let Some(cut) = armed {
                    state.dropped_bytes.fetch_add(n, Ordering::SeqCst);
                    break cut;
                }
                if client.write_all(&down[..n]).await.is_err() { return }
            }
            _ = sever.cancelled() => break Cut::ClientSide,
            _ = hang.cancelled() => {
                state.closed.cancelled().await;
                return;
            }
        }
    };
    drop(client);
    if let Cut::ClientSide = cut {
        let end = state.orphans.lock().unwrap().clone();
        end.cancelled().await;
    }
}
