//! A listener's per-client connection caps (`limits: { connections_per_client,
//! new_connections_per_client }`), enforced as a connection is accepted, before any TLS handshake.
//!
//! The counts are the process's, shared by every worker (a cap on what one client may hold is not a
//! load counter, which workers keep apart): one table per listener behind a mutex, taken once per
//! connection accepted on a listener with caps, never per request. A new connection's allowance is
//! a GCRA bucket per address (the count per period, which may also come at once after a quiet
//! spell). The table holds at most `max_clients` addresses besides those with connections open
//! (which `limits.max_connections` bounds): past it, the addresses whose allowance has refilled
//! go first, as nothing is lost with them, then any with no connection open, counted as forgotten.

use duet_config::ClientLimits;
use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Instant,
};

/// Every listener's per-client counts, shared by the workers.
pub(crate) struct ClientConnections {
    tables: Vec<Mutex<Table>>,
    /// Where the buckets' times count from.
    epoch: Instant,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its client holds `connections_per_client` open already.
    Open,
    /// Its client opened `new_connections_per_client` in the period already.
    New,
}

/// What admitting a connection came to.
pub(crate) struct Admitted {
    /// Held while the connection is open: its count in its client's open connections.
    pub(crate) slot: Slot,
    /// Addresses forgotten to make room for this one, their allowance not refilled yet.
    pub(crate) forgotten: u64,
}

#[derive(Default)]
struct Table {
    clients: HashMap<IpAddr, Client>,
}

/// One address's connections: how many are open, and its GCRA bucket's theoretical arrival time
/// (nanoseconds from the epoch; at or before now, the allowance is whole).
#[derive(Clone, Copy, Default)]
struct Client {
    open: u32,
    due: u64,
}

impl ClientConnections {
    /// Tables for `listeners` listeners.
    pub(crate) fn new(listeners: usize) -> Arc<Self> {
        Arc::new(Self {
            tables: (0..listeners).map(|_| Mutex::default()).collect(),
            epoch: Instant::now(),
        })
    }

    /// Admits a connection from `ip` on listener `listener` under `limits`, or says which cap it is
    /// over. Past `max_clients` addresses, some without a connection open are forgotten first.
    pub(crate) fn admit(
        self: &Arc<Self>,
        listener: usize,
        ip: IpAddr,
        limits: &ClientLimits,
    ) -> Result<Admitted, Refused> {
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let Some(table) = self.tables.get(listener) else {
            return Err(Refused::Open);
        };
        // A worker that panicked holding the lock left counts, not broken invariants.
        let mut table = table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut forgotten = 0;
        if !table.clients.contains_key(&ip) && table.clients.len() >= limits.max_clients as usize {
            forgotten = table.make_room(now, limits.max_clients as usize);
        }
        let client = table.clients.entry(ip).or_default();
        if limits.connections.is_some_and(|cap| client.open >= cap) {
            return Err(Refused::Open);
        }
        if let Some((count, per)) = limits.new_connections {
            let interval =
                u64::try_from(per.as_nanos() / u128::from(count.max(1))).unwrap_or(u64::MAX);
            let tolerance = interval.saturating_mul(u64::from(count.saturating_sub(1)));
            let due = client.due.max(now);
            if due - now > tolerance {
                return Err(Refused::New);
            }
            client.due = due.saturating_add(interval);
        }
        client.open += 1;
        Ok(Admitted {
            slot: Slot {
                shared: self.clone(),
                listener,
                ip,
            },
            forgotten,
        })
    }

    /// How many addresses listener `listener` tracks, and how many connections they hold open.
    #[cfg(test)]
    fn tracked(&self, listener: usize) -> (usize, u32) {
        let table = self.tables[listener]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        (
            table.clients.len(),
            table.clients.values().map(|c| c.open).sum(),
        )
    }
}

impl Table {
    /// Forgets addresses with nothing open: those whose allowance has refilled, then, while more
    /// than three quarters of `max` remain, any other (so that the sweep runs once per quarter of
    /// `max` new addresses at most). Returns how many of the second kind went.
    fn make_room(&mut self, now: u64, max: usize) -> u64 {
        self.clients
            .retain(|_, client| client.open > 0 || client.due > now);
        let keep = max - max / 4;
        let mut forgotten = 0;
        if self.clients.len() >= keep {
            let mut over = self.clients.len() + 1 - keep;
            self.clients.retain(|_, client| {
                if over == 0 || client.open > 0 {
                    return true;
                }
                over -= 1;
                forgotten += 1;
                false
            });
        }
        forgotten
    }
}

/// A connection's count in its client's open connections, given back when it drops (the connection
/// closed).
pub(crate) struct Slot {
    shared: Arc<ClientConnections>,
    listener: usize,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(table) = self.shared.tables.get(self.listener) else {
            return;
        };
        let mut table = table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(client) = table.clients.get_mut(&self.ip) {
            client.open = client.open.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits(connections: Option<u32>, new: Option<u32>, max_clients: u32) -> ClientLimits {
        ClientLimits {
            connections,
            new_connections: new.map(|count| (count, Duration::from_secs(3600))),
            max_clients,
        }
    }

    #[test]
    fn open_connections_are_capped_per_address_and_a_closed_one_frees_its_place() {
        let shared = ClientConnections::new(1);
        let caps = limits(Some(2), None, 10);
        let (a, b): (IpAddr, IpAddr) = (
            "10.0.0.1".parse().expect("ip"),
            "10.0.0.2".parse().expect("ip"),
        );
        let first = shared.admit(0, a, &caps).expect("first");
        let _second = shared.admit(0, a, &caps).expect("second");
        assert_eq!(shared.admit(0, a, &caps).err(), Some(Refused::Open));
        let _other = shared
            .admit(0, b, &caps)
            .expect("another address has its own");
        drop(first);
        let _third = shared.admit(0, a, &caps).expect("a place again");
        assert_eq!(shared.tracked(0), (2, 3));
    }

    #[test]
    fn new_connections_are_capped_per_period_with_the_count_at_once() {
        let shared = ClientConnections::new(1);
        let caps = limits(None, Some(3), 10);
        let a: IpAddr = "::1".parse().expect("ip");
        for _ in 0..3 {
            drop(shared.admit(0, a, &caps).expect("within the allowance"));
        }
        assert_eq!(shared.admit(0, a, &caps).err(), Some(Refused::New));
    }

    #[test]
    fn past_max_clients_idle_addresses_are_forgotten_and_open_ones_kept() {
        let shared = ClientConnections::new(1);
        let caps = limits(Some(5), Some(1), 8);
        let held: Vec<_> = (0..2u8)
            .map(|i| {
                shared
                    .admit(0, IpAddr::from([10, 0, 1, i]), &caps)
                    .expect("open")
            })
            .collect();
        let mut forgotten = 0;
        for i in 0..100u8 {
            let admitted = shared
                .admit(0, IpAddr::from([10, 0, 2, i]), &caps)
                .expect("new");
            forgotten += admitted.forgotten;
        }
        let (tracked, open) = shared.tracked(0);
        assert!(tracked <= 8, "{tracked}");
        assert_eq!(open, 2, "the addresses with connections open stay");
        assert_eq!(forgotten, 100 + 2 - tracked as u64);
        drop(held);
    }
}
