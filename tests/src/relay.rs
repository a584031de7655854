//! A TCP relay on a free loopback port in front of a server, that can cut its connections off
//! without a word: what a failover or a firewall that forgot a connection's state does. The
//! connections it had stay open on both sides and carry nothing more (no FIN, no RST), so each
//! end learns of it only by asking the other to answer; connections made after the cut pass.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A relay to `127.0.0.1:target`, for as long as it lives.
#[derive(Debug)]
pub struct Relay {
    port: u16,
    cuts: Arc<watch::Sender<u64>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Relays a free loopback port to `127.0.0.1:target`.
    pub async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cuts = Arc::new(watch::Sender::new(0u64));
        let accept = {
            let cuts = Arc::clone(&cuts);
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        continue;
                    };
                    tokio::spawn(relay(client, server, cuts.subscribe()));
                }
            })
        };
        Self { port, cuts, accept }
    }

    /// The port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cuts off every connection made so far, silently; later ones pass.
    pub fn cut_silently(&self) {
        self.cuts.send_modify(|cuts| *cuts += 1);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies both ways until either side closes, or until a cut: then holds both open, silent.
async fn relay(client: TcpStream, server: TcpStream, mut cuts: watch::Receiver<u64>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let (mut up, mut down) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    loop {
        tokio::select! {
            read = client_read.read(&mut up) => match read {
                Ok(n) if n > 0 => if server_write.write_all(&up[..n]).await.is_err() { return },
                _ => return,
            },
            read = server_read.read(&mut down) => match read {
                Ok(n) if n > 0 => if client_write.write_all(&down[..n]).await.is_err() { return },
                _ => return,
            },
            _ = cuts.changed() => break,
        }
    }
    // Cut: both sockets stay open and nothing more crosses.
    let _held = (client_read, client_write, server_read, server_write);
    std::future::pending::<()>().await;
}
