//! A small seeded random generator (xoshiro256++ seeded through SplitMix64), kept here
//! so that a seed gives the same run on every platform and with every dependency version.

/// A deterministic pseudo-random generator.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

/// One SplitMix64 step: spreads a seed over the generator's state.
fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        Rng {
            s: [
                splitmix(&mut x),
                splitmix(&mut x),
                splitmix(&mut x),
                splitmix(&mut x),
            ],
        }
    }

    /// An independent generator for one part of the model (`stream` numbers it).
    pub fn fork(seed: u64, stream: u64) -> Self {
        let mut x = stream;
        Rng::new(seed ^ splitmix(&mut x))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform float in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `x` (non-negative) rounded down or up at random, so that the expectation is `x`.
    pub fn round(&mut self, x: f64) -> u64 {
        if x.is_nan() || x <= 0.0 {
            return 0;
        }
        let floor = x.floor();
        floor as u64 + u64::from(self.unit() < x - floor)
    }

    /// `n · part / whole`, randomly rounded, never more than `part` or `n`: how many of
    /// `n` pages picked at random from `whole` fall in a subset of size `part`.
    pub fn share(&mut self, n: u64, part: u64, whole: u64) -> u64 {
        if whole == 0 || part == 0 || n == 0 {
            return 0;
        }
        let x = n as f64 * (part as f64 / whole as f64);
        self.round(x).min(part).min(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::fork(7, 1).next_u64(), Rng::fork(7, 2).next_u64());
    }

    #[test]
    fn random_rounding_keeps_the_expectation() {
        let mut r = Rng::new(1);
        let total: u64 = (0..10_000).map(|_| r.round(0.25)).sum();
        assert!((2300..2700).contains(&total), "{total}");
        assert_eq!(r.round(-3.0), 0);
        assert_eq!(r.round(5.0), 5);
    }

    #[test]
    fn share_is_bounded() {
        let mut r = Rng::new(3);
        for _ in 0..1000 {
            let s = r.share(10, 3, 4);
            assert!(s <= 3);
        }
        assert_eq!(r.share(10, 0, 4), 0);
        assert_eq!(r.share(10, 4, 0), 0);
    }
}
