//! A Redis Cluster reached through one reconnecting connection per node, routed by our own slot
//! map, so a lost master stalls only the calls whose keys live on it.
//!
//! Why not the `redis` crate's cluster connection: it routes every call through one shared state
//! whose recovery (after a call to a dead node failed) holds the slot map's write lock while it
//! reconnects and refreshes, and every call to every node waits behind it. With one master killed,
//! calls to the two healthy masters timed out in bursts for the whole failover (issue 36:
//! `tests/redis/cluster_failover.rs` measured it). Here each node has its own
//! [`ConnectionManager`], the slot map is swapped whole by a background refresh (at most one at a
//! time, at most one per [`REFRESH_GAP`]), and a call never waits for a refresh: a call for a dead
//! master fails at once (or times out) and asks for a refresh, the others go on.
//!
//! What the store sends: `EVALSHA`/`EVAL` with keys (routed by the first key's slot; the store's
//! keys of one call share a hash tag), `SCRIPT LOAD` (to every master), `TIME` (to any master).
//! A `MOVED` answer is followed once to the node it names, and the map refreshed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{
    Arg, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError,
    RedisResult, ServerErrorKind, Value,
};

/// Hash slots in a Redis Cluster.
const SLOTS: usize = 16_384;

/// The least time between two slot-map refreshes.
pub(super) const REFRESH_GAP: Duration = Duration::from_millis(100);

/// How long one node may take to answer `CLUSTER SLOTS` during a refresh.
const REFRESH_NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// A node's address as the cluster announces it.
type NodeAddr = (String, u16);

/// Which slots each master serves, and the connection to each node.
struct Topology {
    /// Per slot: the index in `masters` of the master serving it (`u16::MAX`: none known).
    slots: Box<[u16]>,
    masters: Vec<(NodeAddr, ConnectionManager)>,
    /// Every node the last map named (masters and replicas): where a refresh asks first.
    known: Vec<NodeAddr>,
}

/// The cluster: its slot map and the connections to its nodes.
pub(super) struct Cluster {
    /// How to reach any node: the first start-up node's settings (password, TLS, database).
    template: ConnectionInfo,
    startup: Vec<NodeAddr>,
    manager_config: ConnectionManagerConfig,
    topology: RwLock<Arc<Topology>>,
    /// Connections made so far, by address (a node that moves between master and replica keeps
    /// its connection).
    connections: RwLock<HashMap<NodeAddr, ConnectionManager>>,
    refreshing: AtomicBool,
    /// `started.elapsed()` in ms of the last refresh's start (0: none yet).
    last_refresh_ms: AtomicU64,
    started: Instant,
}

impl Cluster {
    /// A cluster reached through `nodes` (URLs); nothing is sent yet.
    pub(super) fn new(
        nodes: &[String],
        manager_config: ConnectionManagerConfig,
    ) -> RedisResult<Arc<Self>> {
        let infos = nodes
            .iter()
            .map(|n| n.as_str().into_connection_info())
            .collect::<RedisResult<Vec<_>>>()?;
        let Some(template) = infos.first().cloned() else {
            return Err((
                ErrorKind::InvalidClientConfig,
                "no Redis Cluster node given",
            )
                .into());
        };
        let startup = infos.iter().filter_map(|i| address_of(i.addr())).collect();
        Ok(Arc::new(Self {
            template,
            startup,
            manager_config,
            topology: RwLock::new(Arc::new(Topology {
                slots: vec![u16::MAX; SLOTS].into_boxed_slice(),
                masters: Vec::new(),
                known: Vec::new(),
            })),
            connections: RwLock::new(HashMap::new()),
            refreshing: AtomicBool::new(false),
            last_refresh_ms: AtomicU64::new(0),
            started: Instant::now(),
        }))
    }

    fn topology(&self) -> Arc<Topology> {
        Arc::clone(&self.topology.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The connection to `addr`, made (lazily: it connects on first use) if there is none yet.
    fn connection(&self, addr: &NodeAddr) -> RedisResult<ConnectionManager> {
        if let Some(c) = self
            .connections
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(addr)
        {
            return Ok(c.clone());
        }
        let mut connections = self.connections.write().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = connections.get(addr) {
            return Ok(c.clone());
        }
        let info = self
            .template
            .clone()
            .set_addr(node_addr(self.template.addr(), addr));
        let client = redis::Client::open(info)?;
        let manager = ConnectionManager::new_lazy_with_config(client, self.manager_config.clone())?;
        connections.insert(addr.clone(), manager.clone());
        Ok(manager)
    }

    /// Starts a refresh of the slot map in the background, unless one runs or one started less
    /// than [`REFRESH_GAP`] ago.
    pub(super) fn request_refresh(self: &Arc<Self>) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_refresh_ms.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < REFRESH_GAP.as_millis() as u64 {
            return;
        }
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        self.last_refresh_ms.store(now.max(1), Ordering::Relaxed);
        let this = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(e) = this.refresh().await {
                tracing::warn!(%e, "Redis Cluster slot map not refreshed");
            }
            this.refreshing.store(false, Ordering::Release);
        });
    }

    /// Asks the nodes it knows (then the start-up nodes) for `CLUSTER SLOTS` until one answers,
    /// and swaps the slot map for what it said.
    pub(super) async fn refresh(&self) -> RedisResult<()> {
        let current = self.topology();
        let mut candidates: Vec<NodeAddr> = current.known.clone();
        for n in &self.startup {
            if !candidates.contains(n) {
                candidates.push(n.clone());
            }
        }
        let mut last_error: Option<RedisError> = None;
        for addr in candidates {
            let mut connection = match self.connection(&addr) {
                Ok(c) => c,
                Err(e) => {
                    last_error = Some(e);
                    continue;
                }
            };
            let mut slots = redis::cmd("CLUSTER");
            slots.arg("SLOTS");
            let ask = slots.query_async::<Value>(&mut connection);
            let reply = match tokio::time::timeout(REFRESH_NODE_TIMEOUT, ask).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(e)) => {
                    last_error = Some(e);
                    continue;
                }
                Err(_) => {
                    last_error = Some((ErrorKind::Io, "CLUSTER SLOTS timed out").into());
                    continue;
                }
            };
            match self.topology_from(&addr, reply) {
                Ok(topology) => {
                    *self.topology.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(topology);
                    return Ok(());
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| (ErrorKind::Io, "no Redis Cluster node to ask").into()))
    }

    /// The slot map in a `CLUSTER SLOTS` reply from `asked`.
    fn topology_from(&self, asked: &NodeAddr, reply: Value) -> RedisResult<Topology> {
        let bad = || RedisError::from((ErrorKind::Parse, "unexpected CLUSTER SLOTS reply"));
        let Value::Array(ranges) = reply else {
            return Err(bad());
        };
        let mut slots = vec![u16::MAX; SLOTS].into_boxed_slice();
        let mut masters: Vec<(NodeAddr, ConnectionManager)> = Vec::new();
        let mut known: Vec<NodeAddr> = Vec::new();
        for range in ranges {
            let Value::Array(fields) = range else {
                return Err(bad());
            };
            let (Some(Value::Int(from)), Some(Value::Int(to))) = (fields.first(), fields.get(1))
            else {
                return Err(bad());
            };
            let nodes: Vec<NodeAddr> = fields[2..]
                .iter()
                .filter_map(|node| parse_node(node, asked))
                .collect();
            let Some(master) = nodes.first() else {
                continue;
            };
            for n in &nodes {
                if !known.contains(n) {
                    known.push(n.clone());
                }
            }
            let index = match masters.iter().position(|(a, _)| a == master) {
                Some(i) => i,
                None => {
                    masters.push((master.clone(), self.connection(master)?));
                    masters.len() - 1
                }
            };
            let (from, to) = (*from as usize, (*to as usize).min(SLOTS - 1));
            if from <= to {
                slots[from..=to].fill(index as u16);
            }
        }
        if masters.is_empty() {
            return Err((ErrorKind::Io, "the Redis Cluster serves no slot").into());
        }
        Ok(Topology {
            slots,
            masters,
            known,
        })
    }

    /// The master serving `slot` now, if the map knows one.
    fn master_of(&self, slot: u16) -> Option<ConnectionManager> {
        let topology = self.topology();
        let index = *topology.slots.get(usize::from(slot))?;
        topology
            .masters
            .get(usize::from(index))
            .map(|(_, c)| c.clone())
    }

    /// Every master's connection (for `SCRIPT LOAD`).
    fn masters(&self) -> Vec<ConnectionManager> {
        self.topology()
            .masters
            .iter()
            .map(|(_, c)| c.clone())
            .collect()
    }

    /// Sends `cmd` where it belongs; a failure asks for a refresh, a `MOVED` is followed once.
    pub(super) async fn send(self: &Arc<Self>, cmd: &Cmd) -> RedisResult<Value> {
        // Cancelled (the caller's timeout) before an answer: the node may hang, ask for a map.
        let mut guard = RefreshOnDrop {
            cluster: self,
            armed: true,
        };
        let result = self.route_and_send(cmd).await;
        guard.armed = false;
        result
    }

    async fn route_and_send(self: &Arc<Self>, cmd: &Cmd) -> RedisResult<Value> {
        match route(cmd) {
            Route::AllMasters => {
                let masters = self.masters();
                if masters.is_empty() {
                    self.request_refresh();
                    return Err(unknown_topology());
                }
                let mut answers = futures_util::future::join_all(
                    masters
                        .into_iter()
                        .map(|mut c| async move { c.req_packed_command(cmd).await }),
                )
                .await;
                if answers.iter().any(Result::is_err) {
                    self.request_refresh();
                }
                // The first error, else the first answer (every master answers the same).
                match answers.iter().position(Result::is_err) {
                    Some(i) => answers.swap_remove(i),
                    None => answers.swap_remove(0),
                }
            }
            Route::Slot(slot) | Route::Any(slot) => {
                let Some(mut connection) = self.master_of(slot) else {
                    self.request_refresh();
                    return Err(unknown_topology());
                };
                match connection.req_packed_command(cmd).await {
                    Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::Moved) => {
                        self.request_refresh();
                        let Some(target) = e.redirect_node().and_then(parse_address) else {
                            return Err(e);
                        };
                        self.connection(&target)?.req_packed_command(cmd).await
                    }
                    Err(e) => {
                        self.request_refresh();
                        Err(e)
                    }
                    Ok(v) => Ok(v),
                }
            }
        }
    }
}

/// Asks for a refresh when a call is dropped before its answer (its caller timed out).
struct RefreshOnDrop<'a> {
    cluster: &'a Arc<Cluster>,
    armed: bool,
}

impl Drop for RefreshOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.cluster.request_refresh();
        }
    }
}

fn unknown_topology() -> RedisError {
    (ErrorKind::Io, "Redis Cluster slot map not known yet").into()
}

/// Where a command goes.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// To the master of this slot (a command with keys).
    Slot(u16),
    /// To every master (`SCRIPT`).
    AllMasters,
    /// To any one master (a command without keys); the slot picks which.
    Any(u16),
}

fn route(cmd: &Cmd) -> Route {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .filter_map(|a| match a {
            Arg::Simple(bytes) => Some(bytes),
            _ => None,
        })
        .collect();
    let name = args.first().copied().unwrap_or_default();
    if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL") {
        let keys = args
            .get(2)
            .and_then(|n| std::str::from_utf8(n).ok())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        if let (true, Some(key)) = (keys > 0, args.get(3)) {
            return Route::Slot(key_slot(key));
        }
    } else if name.eq_ignore_ascii_case(b"SCRIPT") {
        return Route::AllMasters;
    } else if KEYED.iter().any(|k| name.eq_ignore_ascii_case(k)) {
        // A caller's spend read, a spend epoch's mark: by their one key.
        if let Some(key) = args.get(1) {
            return Route::Slot(key_slot(key));
        }
    }
    Route::Any(0)
}

/// The commands the store sends outside scripts whose first argument is a key (a command not
/// listed here goes to any master, which answers `MOVED` for a key it does not serve).
const KEYED: [&[u8]; 2] = [b"HMGET", b"HSET"];

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{` and
/// the next `}`, if not empty) or of the whole key, modulo 16,384.
pub(super) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    (crc16_xmodem(tagged) as usize % SLOTS) as u16
}

fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// `[host, port, id, ...]` from `CLUSTER SLOTS`; an empty or `?` host is the node asked.
fn parse_node(node: &Value, asked: &NodeAddr) -> Option<NodeAddr> {
    let Value::Array(fields) = node else {
        return None;
    };
    let host = match fields.first()? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
        Value::SimpleString(s) => s.clone(),
        _ => return None,
    };
    let Value::Int(port) = fields.get(1)? else {
        return None;
    };
    let host = if host.is_empty() || host == "?" {
        asked.0.clone()
    } else {
        host
    };
    Some((host, u16::try_from(*port).ok()?))
}

/// `host:port` (as in a `MOVED` answer) as an address.
fn parse_address((addr, _slot): (&str, u16)) -> Option<NodeAddr> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

fn address_of(addr: &ConnectionAddr) -> Option<NodeAddr> {
    match addr {
        ConnectionAddr::Tcp(host, port) => Some((host.clone(), *port)),
        ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
        _ => None,
    }
}

/// The template's kind of address (plain or TLS, its TLS settings) for another node.
fn node_addr(template: &ConnectionAddr, (host, port): &NodeAddr) -> ConnectionAddr {
    match template {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.clone(),
            port: *port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host.clone(), *port),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // The reference values of the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        // Only the hash tag counts; an empty tag does not make one.
        assert_eq!(key_slot(b"tpl:{foo}"), key_slot(b"foo"));
        assert_eq!(key_slot(b"{foo}:settled:1-2"), key_slot(b"foo"));
        assert_eq!(key_slot(b"a{}b"), (crc16_xmodem(b"a{}b") % 16384));
        assert_eq!(key_slot(b"{}{foo}"), (crc16_xmodem(b"{}{foo}") % 16384));
    }

    #[test]
    fn scripts_and_keyed_commands_go_by_their_first_key_others_anywhere() {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg("abc")
            .arg(2)
            .arg("tpl:{m}")
            .arg("tpl:{m}:settled:x")
            .arg(5);
        assert_eq!(route(&evalsha), Route::Slot(key_slot(b"m")));
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg("return 1");
        assert_eq!(route(&load), Route::AllMasters);
        assert_eq!(route(&redis::cmd("TIME")), Route::Any(0));
        let mut keyless = redis::cmd("EVAL");
        keyless.arg("return 1").arg(0);
        assert_eq!(route(&keyless), Route::Any(0));
        let mut spent = redis::cmd("HMGET");
        spent.arg("tpl:{c}:key:k").arg("$p").arg("$s");
        assert_eq!(route(&spent), Route::Slot(key_slot(b"c")));
        let mut mark = redis::cmd("hset");
        mark.arg("tpl:{spend}").arg("restored").arg("e");
        assert_eq!(route(&mark), Route::Slot(key_slot(b"spend")));
    }

    #[test]
    fn cluster_slots_replies_are_read_with_the_asked_node_for_an_unnamed_host() {
        let asked = ("10.0.0.9".to_owned(), 7000);
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        assert_eq!(
            parse_node(&node("127.0.0.1", 7001), &asked),
            Some(("127.0.0.1".to_owned(), 7001))
        );
        assert_eq!(
            parse_node(&node("", 7002), &asked),
            Some(("10.0.0.9".to_owned(), 7002))
        );
        assert_eq!(parse_node(&Value::Int(3), &asked), None);
        assert_eq!(
            parse_address(("127.0.0.1:7005", 42)),
            Some(("127.0.0.1".to_owned(), 7005))
        );
    }
}
