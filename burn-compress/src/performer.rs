//! Performer attention (FAVOR+, Choromanski et al., "Rethinking Attention with Performers",
//! ICLR 2021): multi-head self-attention in time linear in the sequence length, through
//! positive random features. Panther calls this module `RandMultiHeadAttention`.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Distribution, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::attention::{MASKED_SCORE, project_heads};
use super::{AnyLinear, AnyLinearConfig, AnyMultiHeadAttention, LinearKind};
use burn_sketch::SketchBackend;

use crate::CompressError;

/// The feature map `φ` of a [`PerformerAttention`]: attention weights are
/// `φ(q_i)·φ(k_j)`, normalised over the keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FeatureMap {
    /// Positive random features for the softmax kernel (FAVOR+):
    /// `φ(x) = (exp(W·x' − |x'|²/2) + ε)/√m` with `x' = x/d_head^¼`, so that `φ(q)·φ(k)`
    /// is an unbiased estimate of `exp(q·k/√d_head)`, the unnormalised weight of softmax
    /// attention (`ε` and the stabilising shifts aside).
    /// Before the exponential, a query's features are shifted by their own largest `W·x'`, a
    /// key's by the largest `W·x'` over the features and the keys it is summed with (Panther's
    /// stabilisation: the shifts cancel in the normalisation, up to `ε`).
    #[default]
    Softmax,
    /// `φ(x) = relu(W·x/√m) + ε`: a generalised kernel, not an estimate of softmax attention.
    Relu,
}

impl std::fmt::Display for FeatureMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Softmax => write!(f, "softmax"),
            Self::Relu => write!(f, "relu"),
        }
    }
}

/// Configuration of a [`PerformerAttention`].
///
/// ```
/// use burn::{backend::Flex, tensor::{Distribution, Tensor}};
/// use burn_compress::PerformerAttentionConfig;
/// let config = PerformerAttentionConfig::new(64, 4).with_num_features(128).with_causal(true);
/// let attention = config.init::<Flex>(&Default::default());
/// let x = Tensor::<Flex, 3>::random([2, 100, 64], Distribution::Default, &Default::default());
/// assert_eq!(attention.forward(x, None).dims(), [2, 100, 64]);
/// ```
#[derive(Config, Debug)]
pub struct PerformerAttentionConfig {
    /// The width of the model (queries, keys, values and output).
    pub d_model: usize,
    /// The number of heads; must divide `d_model`.
    pub n_heads: usize,
    /// The number of random features `m` (rows of the random projection, shared by the
    /// heads). Panther has no default; 256 is the value its documentation uses.
    #[config(default = 256)]
    pub num_features: usize,
    /// The feature map.
    #[config(default = "FeatureMap::Softmax")]
    pub feature_map: FeatureMap,
    /// If each position attends only to itself and earlier positions.
    #[config(default = false)]
    pub causal: bool,
    /// The kind of the four projections (query, key, value, output).
    #[config(default = "LinearKind::Dense")]
    pub projections: LinearKind,
    /// If the projections add a bias.
    #[config(default = true)]
    pub bias: bool,
    /// The constant `ε` added to every feature (Panther's `numerical_stabilizer`): it keeps
    /// the normaliser away from zero. Must be finite and at least 0.
    #[config(default = 1e-5)]
    pub kernel_epsilon: f64,
    /// The number of positions processed together by the causal path (see
    /// [`PerformerAttention::forward`]); no effect on a non-causal module.
    #[config(default = 64)]
    pub chunk_size: usize,
}

impl PerformerAttentionConfig {
    /// Checks the sizes: `d_model`, `num_features` and `chunk_size` at least 1, `n_heads`
    /// at least 1 and dividing `d_model`, and `kernel_epsilon` finite and non-negative
    /// ([`CompressError::Unsupported`], since it is not a size).
    pub fn validate(&self) -> Result<(), CompressError> {
        CompressError::first_zero([
            ("d_model", self.d_model),
            ("num_features", self.num_features),
            ("chunk_size", self.chunk_size),
        ])?;
        if self.n_heads == 0 || !self.d_model.is_multiple_of(self.n_heads) {
            return Err(CompressError::InvalidConfig {
                name: "n_heads",
                value: self.n_heads,
                reason: "must be at least 1 and divide d_model",
            });
        }
        check_epsilon(self.kernel_epsilon)
    }

    /// Initializes the module: dense projections as Panther initialises its own (Xavier
    /// uniform weights, zero biases), other kinds with their own initialisation, and the
    /// random projection drawn from the backend's generator (seed it with `B::seed` for a
    /// reproducible module).
    ///
    /// # Panics
    /// On an invalid configuration; [`try_init`](Self::try_init) returns the error instead.
    pub fn init<B: Backend>(&self, device: &B::Device) -> PerformerAttention<B> {
        self.try_init(device)
            .unwrap_or_else(|err| panic!("cannot initialise PerformerAttention: {err}"))
    }

    /// [`init`](Self::init), or the error naming the bad value.
    pub fn try_init<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<PerformerAttention<B>, CompressError> {
        self.validate()?;
        let d = self.d_model;
        let projection = || -> Result<AnyLinear<B>, CompressError> {
            match self.projections {
                LinearKind::Dense => Ok(xavier_linear(d, self.bias, device).into()),
                kind => AnyLinearConfig::new(d, d)
                    .with_bias(self.bias)
                    .with_kind(kind)
                    .try_init(device),
            }
        };
        Ok(PerformerAttention {
            query: projection()?,
            key: projection()?,
            value: projection()?,
            output: projection()?,
            projection: fixed(orthogonal_random_features(
                self.num_features,
                d / self.n_heads,
                device,
            )),
            n_heads: self.n_heads,
            feature_map: self.feature_map,
            causal: self.causal,
            kernel_epsilon: self.kernel_epsilon,
            chunk_size: self.chunk_size,
        })
    }
}

fn check_epsilon(epsilon: f64) -> Result<(), CompressError> {
    if epsilon.is_finite() && epsilon >= 0.0 {
        Ok(())
    } else {
        Err(CompressError::Unsupported {
            what: format!("kernel_epsilon = {epsilon}: it must be finite and at least 0"),
        })
    }
}

/// Multi-head self-attention with positive random features (Performer / FAVOR+), Panther's
/// `RandMultiHeadAttention`: it never forms softmax attention's `seq × seq` weights, so time
/// and memory grow linearly with the sequence length instead of quadratically, which pays for
/// contexts much longer than its feature count. The formula and its random features are in the
/// book's "Transformers and conversion" chapter.
///
/// The projections are [`AnyLinear`]s, so the module is dense, sketched or low-rank by
/// configuration; [`from_attention`](Self::from_attention) and
/// [`from_burn`](Self::from_burn) build it from a trained softmax attention module, and
/// [`load_performer`](crate::load_performer) from a Panther checkpoint.
#[doc(alias = "RandMultiHeadAttention")]
#[doc(alias = "FAVOR")]
#[derive(Module, Debug)]
pub struct PerformerAttention<B: Backend> {
    /// Query projection, `[d_model, d_model]`.
    pub query: AnyLinear<B>,
    /// Key projection.
    pub key: AnyLinear<B>,
    /// Value projection.
    pub value: AnyLinear<B>,
    /// Output projection.
    pub output: AnyLinear<B>,
    /// The random projection `W`, `[num_features, d_head]`. Saved in records, never trained
    /// (`require_grad` is off), like [`SkLinear`](burn_sketch::SkLinear)'s sketches.
    pub projection: Param<Tensor<B, 2>>,
    /// The number of heads.
    pub n_heads: usize,
    /// The feature map.
    pub feature_map: FeatureMap,
    /// If the attention is causal.
    pub causal: bool,
    /// The constant `ε` added to every feature.
    pub kernel_epsilon: f64,
    /// The number of positions the causal path processes together (values below 1 count as 1).
    pub chunk_size: usize,
}

impl<B: Backend> PerformerAttention<B> {
    /// The Performer with the projections of our softmax [`AnyMultiHeadAttention`] (any kind,
    /// copied as they are), its number of heads and causality, `num_features` random features
    /// drawn from the backend's generator, and the default `kernel_epsilon` and `chunk_size`
    /// (public fields, to be set afterwards). With the softmax feature map it estimates the
    /// same function, closer as `num_features` grows. The attention dropout has no
    /// counterpart: a Performer never forms the attention weights (Panther's module takes a
    /// dropout rate and ignores it).
    pub fn from_attention(
        mha: &AnyMultiHeadAttention<B>,
        num_features: usize,
        feature_map: FeatureMap,
    ) -> Result<Self, CompressError> {
        Self::from_projections(
            [&mha.query, &mha.key, &mha.value, &mha.output].map(copy),
            mha.n_heads,
            num_features,
            feature_map,
            mha.causal,
        )
    }

    /// The Performer with the projections of Burn's `nn::attention::MultiHeadAttention`
    /// (copied as dense layers) and its number of heads, as
    /// [`from_attention`](Self::from_attention) does for ours. Burn's module takes its mask
    /// per call: pass `causal` here. (Burn's `quiet_softmax` variant has no random-feature
    /// counterpart; the Performer estimates plain softmax attention.)
    pub fn from_burn(
        mha: &burn::nn::attention::MultiHeadAttention<B>,
        num_features: usize,
        feature_map: FeatureMap,
        causal: bool,
    ) -> Result<Self, CompressError> {
        Self::from_projections(
            [&mha.query, &mha.key, &mha.value, &mha.output].map(|p| copy(p).into()),
            mha.n_heads,
            num_features,
            feature_map,
            causal,
        )
    }

    fn from_projections(
        [query, key, value, output]: [AnyLinear<B>; 4],
        n_heads: usize,
        num_features: usize,
        feature_map: FeatureMap,
        causal: bool,
    ) -> Result<Self, CompressError> {
        let config = PerformerAttentionConfig::new(query.d_input(), n_heads)
            .with_num_features(num_features)
            .with_feature_map(feature_map)
            .with_causal(causal);
        config.validate()?;
        let device = query
            .devices()
            .into_iter()
            .next()
            .expect("a linear layer holds a tensor");
        Ok(Self {
            projection: fixed(orthogonal_random_features(
                num_features,
                config.d_model / n_heads,
                &device,
            )),
            query,
            key,
            value,
            output,
            n_heads,
            feature_map,
            causal,
            kernel_epsilon: config.kernel_epsilon,
            chunk_size: config.chunk_size,
        })
    }

    /// The module with a fresh random projection of the same size, drawn from the backend's
    /// generator (the Performer paper redraws it from time to time during training; Panther
    /// never does).
    pub fn redraw_projection(self) -> Self {
        let [m, d_head] = self.projection.dims();
        let device = self.projection.device();
        Self {
            projection: fixed(orthogonal_random_features(m, d_head, &device)),
            ..self
        }
    }

    /// The model width.
    pub fn d_model(&self) -> usize {
        self.query.d_input()
    }

    /// The width of each head, `d_model / n_heads`.
    pub fn d_head(&self) -> usize {
        self.d_model() / self.n_heads
    }

    /// The number of random features `m`.
    pub fn num_features(&self) -> usize {
        self.projection.dims()[0]
    }
}

impl<B: SketchBackend> PerformerAttention<B> {
    /// Self-attention over `input`, in time and memory linear in `seq`. Causal modules carry
    /// the prefix sums from chunk to chunk of `chunk_size` positions, and no later token
    /// changes an earlier output (the costs, and how this differs from Panther, are in the
    /// book's Performer section).
    ///
    /// # Shapes
    /// - input: `[batch, seq, d_model]`
    /// - mask_pad: `[batch, seq]`, `true` at padding positions, whose keys and values take no
    ///   part (not even in the stabiliser); their own outputs are meaningless, and a query with
    ///   no key to attend to (every key up to it padded) gets a zero context.
    /// - output: `[batch, seq, d_model]`
    pub fn forward(
        &self,
        input: Tensor<B, 3>,
        mask_pad: Option<Tensor<B, 2, Bool>>,
    ) -> Tensor<B, 3> {
        let [batch, seq, d_model] = input.dims();
        let [q, k, v] = project_heads([&self.query, &self.key, &self.value], input, self.n_heads);
        let pad = mask_pad.map(|pad| pad.reshape([batch, 1, seq, 1]));
        let context = self.attend(q, k, v, pad);
        self.output
            .forward(context.swap_dims(1, 2).reshape([batch, seq, d_model]))
    }
}

/// The keys' side of the attention: `φ(k_j) = part_j + β` for unpadded keys, zero for
/// padded ones.
struct KeyFeatures<B: Backend> {
    /// `[batch, heads, seq, m]`, zero at padding positions.
    part: Tensor<B, 4>,
    /// The constant part of every unpadded key's features.
    beta: f64,
    /// Causal softmax features only: `part_j` is scaled by `exp(−log_scale_j)`, the running
    /// maximum up to `j` (`[batch, heads, seq, 1]`); key `j` enters query `i`'s sums with
    /// the factor `exp(log_scale_j − log_scale_i)`.
    log_scale: Option<Tensor<B, 4>>,
}

/// The sums over the keys of the chunks already processed, for the causal path.
struct Carried<B: Backend> {
    /// `Σ_j part_j v_jᵀ · exp(log_scale_j − scale)`, `[batch, heads, m, d_head]`.
    kv: Tensor<B, 4>,
    /// `Σ_j part_j · exp(log_scale_j − scale)`, `[batch, heads, m, 1]`.
    norm: Tensor<B, 4>,
    /// `Σ_j v_j` over the unpadded keys (padded values are zero), `[batch, heads, 1, d_head]`.
    v_sum: Tensor<B, 4>,
    /// The number of unpadded keys, `[batch, 1, 1, 1]`.
    count: Tensor<B, 4>,
    /// The running maximum at the last key carried, `[batch, heads, 1, 1]` (softmax only).
    scale: Option<Tensor<B, 4>>,
}

impl<B: Backend> PerformerAttention<B> {
    /// Attention of the heads `[batch, heads, seq, d_head]`, with the padding mask
    /// `[batch, 1, seq, 1]`.
    fn attend(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        pad: Option<Tensor<B, 4, Bool>>,
    ) -> Tensor<B, 4> {
        if v.dims()[2] == 0 {
            return v;
        }
        let queries = self.query_features(q);
        let keys = self.key_features(k, pad.clone());
        let (v, keep) = match pad {
            Some(pad) => {
                let dims = v.dims();
                (
                    v.mask_fill(pad.clone().expand(dims), 0.0),
                    Some(pad.bool_not().float()),
                )
            }
            None => (v, None),
        };
        if self.causal {
            self.causal_context(queries, keys, keep, v)
        } else {
            noncausal_context(queries, keys, keep, v)
        }
    }

    /// `1/√m`.
    fn ratio(&self) -> f64 {
        1.0 / (self.num_features() as f64).sqrt()
    }

    /// `x·Wᵀ`: `[batch, heads, seq, d_head]` to `[batch, heads, seq, m]`.
    fn project(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [batch, heads, seq, d_head] = x.dims();
        let w = self.projection.val();
        let m = w.dims()[0];
        x.reshape([batch * heads * seq, d_head])
            .matmul(w.transpose())
            .reshape([batch, heads, seq, m])
    }

    /// The softmax map's exponent before stabilisation, in two parts: `W·x'` and
    /// `|x'|²/2`, with `x' = x/d_head^¼`.
    fn softmax_parts(&self, x: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let d_head = x.dims()[3];
        let x = x.mul_scalar((d_head as f64).powf(-0.25));
        let half_norm = x.clone().square().sum_dim(3).div_scalar(2.0);
        (self.project(x), half_norm)
    }

    /// `φ(q)`, `[batch, heads, seq, m]`, each query stabilised by its own largest `W·q'`.
    fn query_features(&self, q: Tensor<B, 4>) -> Tensor<B, 4> {
        let (ratio, epsilon) = (self.ratio(), self.kernel_epsilon);
        match self.feature_map {
            FeatureMap::Softmax => {
                let (dash, half_norm) = self.softmax_parts(q);
                let shift = dash.clone().max_dim(3);
                (dash - half_norm - shift)
                    .exp()
                    .add_scalar(epsilon)
                    .mul_scalar(ratio)
            }
            FeatureMap::Relu => relu(self.project(q).mul_scalar(ratio)).add_scalar(epsilon),
        }
    }

    /// `φ(k)`. Softmax keys are stabilised by the largest `W·k'` over the features and the
    /// unpadded keys: all of them (non-causal, as Panther), or those up to the key (causal).
    fn key_features(&self, k: Tensor<B, 4>, pad: Option<Tensor<B, 4, Bool>>) -> KeyFeatures<B> {
        let (ratio, epsilon) = (self.ratio(), self.kernel_epsilon);
        let masked = |x: Tensor<B, 4>, value: f64| match &pad {
            Some(pad) => {
                let dims = x.dims();
                x.mask_fill(pad.clone().expand(dims), value)
            }
            None => x,
        };
        match self.feature_map {
            FeatureMap::Softmax => {
                let (dash, half_norm) = self.softmax_parts(k);
                let largest = masked(dash.clone().max_dim(3), MASKED_SCORE);
                let log_scale = if self.causal {
                    largest.cummax(2)
                } else {
                    largest.max_dim(2)
                };
                // The exponent is masked, not the exponential: no infinity reaches the graph.
                let exponent = masked(dash - half_norm - log_scale.clone(), MASKED_SCORE);
                KeyFeatures {
                    part: exponent.exp().mul_scalar(ratio),
                    beta: epsilon * ratio,
                    log_scale: self.causal.then_some(log_scale),
                }
            }
            FeatureMap::Relu => KeyFeatures {
                part: masked(relu(self.project(k).mul_scalar(ratio)), 0.0),
                beta: epsilon,
                log_scale: None,
            },
        }
    }

    /// The causal context `[batch, heads, seq, d_head]`, chunk by chunk (see
    /// [`forward`](PerformerAttention::forward)).
    ///
    /// For query `i` and key `j ≤ i`, the weight is
    /// `A_ij = (φ(q_i)·part_j)·exp(s_j − s_i) + β·Σφ(q_i)`, `s` the running maximum: every
    /// factor `exp(s_j − s_i)` is at most 1, so nothing overflows however the scale of the
    /// keys varies along the sequence.
    fn causal_context(
        &self,
        queries: Tensor<B, 4>,
        keys: KeyFeatures<B>,
        keep: Option<Tensor<B, 4>>,
        v: Tensor<B, 4>,
    ) -> Tensor<B, 4> {
        let [batch, heads, seq, _] = queries.dims();
        let device = queries.device();
        let chunk = self.chunk_size.clamp(1, seq);
        let beta = keys.beta;
        let keep = keep.unwrap_or_else(|| Tensor::ones([batch, 1, seq, 1], &device));
        let query_sums = queries.clone().sum_dim(3);
        let mut carried: Option<Carried<B>> = None;
        let mut outputs = Vec::with_capacity(seq.div_ceil(chunk));
        for start in (0..seq).step_by(chunk) {
            let len = chunk.min(seq - start);
            let part = |x: &Tensor<B, 4>| x.clone().narrow(2, start, len);
            let (q, q_sum, p, v_c, keep_c) = (
                part(&queries),
                part(&query_sums),
                part(&keys.part),
                part(&v),
                part(&keep),
            );
            let scale = keys.log_scale.as_ref().map(part);
            // `tril_mask` is true above the diagonal: the keys after each query.
            let future = Tensor::<B, 2, Bool>::tril_mask([len, len], 0, &device)
                .reshape([1, 1, len, len])
                .expand([batch, heads, len, len]);
            let past = future.clone().bool_not().float();

            // Within the chunk: the masked quadratic form.
            let scores = q.clone().matmul(p.clone().swap_dims(2, 3));
            let scores = match &scale {
                Some(s) => {
                    // Both operands expanded to the full square: Burn 0.21's fusion computes
                    // `sᵀ - s` wrongly when both sides broadcast one tensor and `len` is even
                    // (the wgpu tests hold this).
                    let square = [batch, heads, len, len];
                    let decay = (s.clone().swap_dims(2, 3).expand(square)
                        - s.clone().expand(square))
                    .mask_fill(future, MASKED_SCORE)
                    .exp();
                    scores * decay
                }
                None => scores * past.clone(),
            };
            let floor = keep_c.clone().swap_dims(2, 3) * past;
            let weights = scores + q_sum.clone() * floor.mul_scalar(beta);
            let mut numerator = weights.clone().matmul(v_c.clone());
            let mut denominator = weights.sum_dim(3);

            // The keys of earlier chunks.
            if let Some(c) = &carried {
                let mut kv = q.clone().matmul(c.kv.clone());
                let mut norm = q.matmul(c.norm.clone());
                if let (Some(s), Some(previous)) = (&scale, &c.scale) {
                    let decay = (previous.clone() - s.clone()).exp();
                    kv = kv * decay.clone();
                    norm = norm * decay;
                }
                numerator = numerator + kv + q_sum.clone() * c.v_sum.clone().mul_scalar(beta);
                denominator = denominator + norm + q_sum * c.count.clone().mul_scalar(beta);
            }
            outputs.push(numerator / nonzero(denominator));

            if start + len < seq {
                carried = Some(carry(carried, p, v_c, keep_c, scale));
            }
        }
        Tensor::cat(outputs, 2)
    }
}

/// Adds a chunk's keys to the carried sums, rescaled to the chunk's last running maximum.
fn carry<B: Backend>(
    carried: Option<Carried<B>>,
    part: Tensor<B, 4>,
    v: Tensor<B, 4>,
    keep: Tensor<B, 4>,
    scale: Option<Tensor<B, 4>>,
) -> Carried<B> {
    let len = part.dims()[2];
    let (part, last) = match scale {
        Some(s) => {
            let last = s.clone().narrow(2, len - 1, 1);
            (part * (s - last.clone()).exp(), Some(last))
        }
        None => (part, None),
    };
    let kv = part.clone().swap_dims(2, 3).matmul(v.clone());
    let norm = part.sum_dim(2).swap_dims(2, 3);
    let v_sum = v.sum_dim(2);
    let count = keep.sum_dim(2);
    match carried {
        None => Carried {
            kv,
            norm,
            v_sum,
            count,
            scale: last,
        },
        Some(c) => {
            let (old_kv, old_norm) = match (&c.scale, &last) {
                (Some(previous), Some(last)) => {
                    let decay = (previous.clone() - last.clone()).exp();
                    (c.kv * decay.clone(), c.norm * decay)
                }
                _ => (c.kv, c.norm),
            };
            Carried {
                kv: old_kv + kv,
                norm: old_norm + norm,
                v_sum: c.v_sum + v_sum,
                count: c.count + count,
                scale: last,
            }
        }
    }
}

/// The non-causal context: `φ(Q)·(φ(K)ᵀ·V) / φ(Q)·(φ(K)ᵀ·1)`.
fn noncausal_context<B: Backend>(
    queries: Tensor<B, 4>,
    keys: KeyFeatures<B>,
    keep: Option<Tensor<B, 4>>,
    v: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let features = match keep {
        Some(keep) => keys.part + keep.mul_scalar(keys.beta),
        None => keys.part.add_scalar(keys.beta),
    };
    let kv = features.clone().swap_dims(2, 3).matmul(v);
    let numerator = queries.clone().matmul(kv);
    let denominator = (queries * features.sum_dim(2)).sum_dim(3);
    numerator / nonzero(denominator)
}

/// The normaliser with zeros (queries with no key) replaced by ones: a zero context.
fn nonzero<B: Backend>(denominator: Tensor<B, 4>) -> Tensor<B, 4> {
    let zero = denominator.clone().equal_elem(0.0);
    denominator.mask_fill(zero, 1.0)
}

/// A dense `d → d` layer initialised as Panther initialises its projections: weights uniform
/// in `±√(6/(2d))` (Xavier), biases zero. Drawn now, not lazily, so that a seeded
/// initialisation draws in a fixed order.
fn xavier_linear<B: Backend>(d: usize, bias: bool, device: &B::Device) -> Linear<B> {
    let bound = (3.0 / d as f64).sqrt();
    Linear {
        weight: Param::from_tensor(Tensor::random(
            [d, d],
            Distribution::Uniform(-bound, bound),
            device,
        )),
        bias: bias.then(|| Param::from_tensor(Tensor::zeros([d], device))),
    }
}

/// A copy of `module` with the same values. Cloning a parameter that is still lazy (Burn's
/// layers draw their weights on first use) would give the copy a lazy initialisation of its
/// own, hence other weights: every parameter is initialised first.
fn copy<B: Backend, M: Module<B>>(module: &M) -> M {
    burn_memory::draw_params(module);
    module.clone()
}

/// Wraps the random projection: saved in records, never trained.
fn fixed<B: Backend>(projection: Tensor<B, 2>) -> Param<Tensor<B, 2>> {
    Param::from_tensor(projection).set_require_grad(false)
}

/// FAVOR+'s orthogonal random features, `[m, d]`: the rows of each block of `d` are a
/// Gaussian block orthonormalised (Householder QR, in `f64` on the host: a block is small;
/// the last block keeps the rows it needs), each row then rescaled to the length of an
/// independent standard Gaussian vector of `ℝ^d`, so that every row is marginally `N(0, I)`
/// while the rows of a block are exactly orthogonal. Both draws come from the backend's
/// generator.
fn orthogonal_random_features<B: Backend>(m: usize, d: usize, device: &B::Device) -> Tensor<B, 2> {
    let normal = Distribution::Normal(0.0, 1.0);
    let host = |x: Tensor<B, 2>| {
        x.into_data()
            .convert::<f64>()
            .to_vec::<f64>()
            .expect("converted to f64 just above")
    };
    let mut rows = host(Tensor::random([m, d], normal, device));
    let lengths = host(Tensor::random([m, d], normal, device));
    for block in rows.chunks_mut(d * d) {
        orthonormalise_rows(block, d);
    }
    for (row, gaussian) in rows.chunks_mut(d).zip(lengths.chunks(d)) {
        let length = gaussian.iter().map(|x| x * x).sum::<f64>().sqrt();
        row.iter_mut().for_each(|x| *x *= length);
    }
    let values = rows.into_iter().map(|x| x as f32).collect::<Vec<_>>();
    Tensor::from_data(TensorData::new(values, [m, d]), device)
}

/// Orthonormalises the rows (of length `d`) of `block` (at most `d` of them): Householder QR
/// of the block's transpose (faer, `f64`), each column of `Q` signed like `R`'s diagonal so
/// that a Gaussian block gives Haar-distributed rows.
fn orthonormalise_rows(block: &mut [f64], d: usize) {
    let rows = block.len() / d;
    let transposed = faer::Mat::<f64>::from_fn(d, rows, |i, j| block[j * d + i]);
    let factor = transposed.qr();
    let q = factor.compute_thin_Q();
    let r = factor.thin_R();
    for j in 0..rows {
        let sign = if r[(j, j)] < 0.0 { -1.0 } else { 1.0 };
        for i in 0..d {
            block[j * d + i] = sign * q[(i, j)];
        }
    }
}
