//! A hash that is the same in every process, worker and machine: what consistent hashing needs to send
//! a key to the same endpoint everywhere (and what `std`'s `RandomState` exists to prevent).

use std::hash::{Hash, Hasher};

/// `value`'s hash with no seed: the same on every worker, every restart and every duet instance.
///
/// FNV-1a over the bytes [`Hash`] writes, integers taken little-endian and lengths as 64 bits (so a
/// 32-bit and a 64-bit machine, or a big- and a little-endian one, agree), then the SplitMix64
/// finaliser so that keys differing in one byte differ in every bit. Not meant to resist a client
/// choosing keys to collide: a client who controls the key chooses its backend anyway.
///
/// ```
/// use duet_balance::algo::stable_hash;
///
/// assert_eq!(stable_hash("user-42"), stable_hash(&String::from("user-42")));
/// assert_ne!(stable_hash("user-42"), stable_hash("user-43"));
/// ```
pub fn stable_hash<T: Hash + ?Sized>(value: &T) -> u64 {
    let mut hasher = StableHasher::default();
    value.hash(&mut hasher);
    hasher.finish()
}

/// FNV-1a, platform-independent (see [`stable_hash`]).
#[derive(Debug, Clone, Copy)]
struct StableHasher(u64);

impl Default for StableHasher {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        mix(self.0)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn write_u16(&mut self, i: u16) {
        self.write(&i.to_le_bytes());
    }

    fn write_u32(&mut self, i: u32) {
        self.write(&i.to_le_bytes());
    }

    fn write_u64(&mut self, i: u64) {
        self.write(&i.to_le_bytes());
    }

    fn write_u128(&mut self, i: u128) {
        self.write(&i.to_le_bytes());
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }

    fn write_i16(&mut self, i: i16) {
        self.write_u16(i as u16);
    }

    fn write_i32(&mut self, i: i32) {
        self.write_u32(i as u32);
    }

    fn write_i64(&mut self, i: i64) {
        self.write_u64(i as u64);
    }

    fn write_isize(&mut self, i: isize) {
        self.write_u64(i as u64);
    }
}

/// SplitMix64's finaliser: every input bit moves about half the output bits.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    /// Pinned values: a change here moves every key of every deployed cluster, so it must be deliberate.
    #[test]
    fn the_hash_is_pinned() {
        let address = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 8080);
        let pinned = [stable_hash("user-42"), stable_hash(&address)];
        assert_eq!(
            pinned,
            [3_187_500_886_272_966_307, 14_344_106_939_656_167_534]
        );
        assert_ne!(stable_hash(&1u32), stable_hash(&1u64));
        // Lengths are 64-bit whatever the platform: a `usize` hashes as the `u64` of the same value.
        assert_eq!(stable_hash(&7usize), stable_hash(&7u64));
    }
}
