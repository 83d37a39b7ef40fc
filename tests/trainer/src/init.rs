//! Canonical, seeded weight initialisation.
//!
//! Every tensor is generated whole (unsharded) from the seed and its canonical name, then each
//! rank slices its shard: all layouts start from the same weights as the reference.

/// SplitMix64, keyed by a seed and a path of integers.
#[derive(Debug, Clone)]
pub struct SplitMix {
    state: u64,
}

impl SplitMix {
    /// A generator for `seed` and `path`.
    pub fn new(seed: u64, path: &[u64]) -> SplitMix {
        let mut g = SplitMix { state: seed };
        for &p in path {
            g.state ^= p.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            g.next_u64();
        }
        g
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// FNV-1a hash of a name, to key its generator.
pub fn name_key(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// How a tensor starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Normal(0, std).
    Normal(f32),
    /// All ones (norm weights).
    Ones,
    /// All zeros (norm biases).
    Zeros,
}

/// The whole canonical tensor `name` of `numel` elements.
pub fn canonical(seed: u64, name: &str, numel: usize, init: Init) -> Vec<f32> {
    match init {
        Init::Ones => vec![1.0; numel],
        Init::Zeros => vec![0.0; numel],
        Init::Normal(std) => {
            let mut g = SplitMix::new(seed, &[name_key(name)]);
            (0..numel)
                .map(|_| (g.normal() * std as f64) as f32)
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_weights_depend_on_seed_and_name_only() {
        let a = canonical(1, "layers.0.mlp.fc1.weight", 1000, Init::Normal(0.02));
        assert_eq!(
            a,
            canonical(1, "layers.0.mlp.fc1.weight", 1000, Init::Normal(0.02))
        );
        assert_ne!(
            a,
            canonical(2, "layers.0.mlp.fc1.weight", 1000, Init::Normal(0.02))
        );
        assert_ne!(
            a,
            canonical(1, "layers.1.mlp.fc1.weight", 1000, Init::Normal(0.02))
        );
        let mean = a.iter().map(|&x| x as f64).sum::<f64>() / 1000.0;
        let var = a.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / 1000.0;
        assert!(
            mean.abs() < 0.003 && (var.sqrt() - 0.02).abs() < 0.003,
            "{mean} {var}"
        );
    }
}
