//! Wake-ups between gateways: each store subscribes to its models' `PREFIX{model}:wake` channels
//! and hands every message to the queue (through the settled hook), so a waiter on one gateway
//! looks again when the fleet's order moves or room frees on another. admit.lua publishes when an
//! admission moves the order while others wait, settle.lua when a settlement frees room while
//! someone may wait, leave.lua when the head of the order leaves.
//!
//! Pub/sub rather than polling, keyspace notifications or blocking commands (measured in
//! benches/RESULTS.md: all three wake in the same ~0.1 ms): a message costs Redis one `PUBLISH`
//! inside the script that moved the order (no extra round trip), reaches every gateway at once,
//! and costs nothing while nobody waits (nothing is published then), where keyspace
//! notifications send every write to every gateway and blocking commands hold a connection per
//! gateway and model. A message lost while the
//! subscription reconnects costs a waiter at most its safety timer ([`super::ORDER_RETRY_MS`]).
//!
//! On a Redis Cluster a `PUBLISH` (not the sharded `SPUBLISH`) reaches the subscribers of every
//! node over the cluster bus, so one subscription to any node hears every model: the store
//! subscribes to the first of its startup nodes that answers, and to the next when that one
//! fails.

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt;

use super::Inner;
use crate::config::ModelId;

/// How long to wait before subscribing again after the subscription failed.
const RESUBSCRIBE_AFTER: Duration = Duration::from_millis(200);

/// Listens until the store is gone, subscribing again whenever the subscription ends or fails:
/// to `clients` in turn (one server, or a cluster's startup nodes), the next one each time.
pub(super) async fn listen(clients: Vec<redis::Client>, inner: Weak<Inner>) {
    if clients.is_empty() {
        return;
    }
    let mut at = 0;
    loop {
        let channels: Vec<String> = match inner.upgrade() {
            Some(inner) => inner.flow_keys.iter().map(|k| k.channel.clone()).collect(),
            None => return,
        };
        match subscribe(&clients[at % clients.len()], &channels).await {
            Ok(mut pubsub) => {
                let mut messages = pubsub.on_message();
                while let Some(message) = messages.next().await {
                    let Some(inner) = inner.upgrade() else {
                        return;
                    };
                    let channel = message.get_channel_name();
                    if let Some(model) = channels.iter().position(|c| c == channel) {
                        inner.wake(ModelId(model as u32));
                    }
                }
                tracing::debug!("queue wake-up subscription ended; subscribing again");
            }
            Err(e) => tracing::debug!(%e, "queue wake-up subscription failed; retrying"),
        }
        // The next node, in case this one is gone (a cluster's others carry the messages too).
        at += 1;
        if inner.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(RESUBSCRIBE_AFTER).await;
    }
}

async fn subscribe(
    client: &redis::Client,
    channels: &[String],
) -> redis::RedisResult<redis::aio::PubSub> {
    let mut pubsub = client.get_async_pubsub().await?;
    for channel in channels {
        pubsub.subscribe(channel).await?;
    }
    Ok(pubsub)
}
