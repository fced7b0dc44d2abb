//! A plain low-rank linear layer, `y = x·A·B + b`: the baseline a sketched layer of the same
//! trainable size must beat.

use burn::config::Config;
use burn::module::{Content, DisplaySettings, Module, ModuleDisplay, Param};
use burn::nn::{Initializer, Linear};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::CompressError;
use burn_randnla::{LinalgError, RandomizedSvdConfig, host};
use faer::linalg::triangular_solve::solve_upper_triangular_in_place;
use faer::{Mat, Par, Side};

/// Configuration of a [`LowRankLinear`] layer.
///
/// ```
/// use burn::backend::Flex;
/// use burn_compress::LowRankLinearConfig;
///
/// let layer = LowRankLinearConfig::new(256, 128, 8).init::<Flex>(&Default::default());
/// assert_eq!(layer.num_trainable(), 8 * (256 + 128) + 128);
/// ```
#[derive(Config, Debug)]
pub struct LowRankLinearConfig {
    /// The size of the input features.
    pub d_input: usize,
    /// The size of the output features.
    pub d_output: usize,
    /// The rank `r` of the factorisation.
    pub rank: usize,
    /// If a bias is added after the product.
    #[config(default = true)]
    pub bias: bool,
}

impl LowRankLinearConfig {
    /// Initializes the layer: `A` (`[d_input, r]`) and the bias as `nn::Linear` draws its
    /// weight (Kaiming uniform on the fan-in `d_input`), `B` (`[r, d_output]`) Kaiming uniform
    /// on its fan-in `r`, so that activations keep the scale a dense layer would give them.
    ///
    /// # Panics
    /// If a size is zero; [`try_init`](Self::try_init) returns the error instead.
    pub fn init<B: Backend>(&self, device: &B::Device) -> LowRankLinear<B> {
        self.try_init(device)
            .unwrap_or_else(|err| panic!("cannot initialise LowRankLinear: {err}"))
    }

    /// [`init`](Self::init), or the error naming the first zero size.
    pub fn try_init<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<LowRankLinear<B>, CompressError> {
        CompressError::first_zero([
            ("d_input", self.d_input),
            ("d_output", self.d_output),
            ("rank", self.rank),
        ])?;
        let kaiming = Initializer::KaimingUniform {
            gain: 1.0 / 3.0f64.sqrt(),
            fan_out_only: false,
        };
        let a = kaiming.init_with(
            [self.d_input, self.rank],
            Some(self.d_input),
            Some(self.rank),
            device,
        );
        let b = kaiming.init_with(
            [self.rank, self.d_output],
            Some(self.rank),
            Some(self.d_output),
            device,
        );
        let bias = self.bias.then(|| {
            kaiming.init_with(
                [self.d_output],
                Some(self.d_input),
                Some(self.d_output),
                device,
            )
        });
        Ok(LowRankLinear { a, b, bias })
    }
}

/// `y = x·A·B + bias` with `A` `[d_input, r]` and `B` `[r, d_output]`, both trained: the
/// classic factorised layer. It has `r·(d_input + d_output)` weights, as many as a
/// [`SkLinear`](burn_sketch::SkLinear) with `T·k = r` has trainable ones, which makes it the fair
/// baseline for a sketched layer.
#[derive(Module, Debug)]
#[module(custom_display)]
pub struct LowRankLinear<B: Backend> {
    /// Left factor, `[d_input, r]`.
    pub a: Param<Tensor<B, 2>>,
    /// Right factor, `[r, d_output]`.
    pub b: Param<Tensor<B, 2>>,
    /// Optional bias, `[d_output]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> LowRankLinear<B> {
    /// Applies the layer to the input's last dimension.
    ///
    /// # Shapes
    /// - input: `[..., d_input]`
    /// - output: `[..., d_output]`
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        let dims = input.dims();
        let rows: usize = dims[..D - 1].iter().product();
        let x = input.reshape([rows, dims[D - 1]]);
        let y = x.matmul(self.a.val()).matmul(self.b.val());
        let y = match &self.bias {
            Some(bias) => y + bias.val().unsqueeze_dim(0),
            None => y,
        };
        let mut out = dims;
        out[D - 1] = self.d_output();
        y.reshape(out)
    }

    /// The size of the input features.
    pub fn d_input(&self) -> usize {
        self.a.dims()[0]
    }

    /// The size of the output features.
    pub fn d_output(&self) -> usize {
        self.b.dims()[1]
    }

    /// The rank `r`.
    pub fn rank(&self) -> usize {
        self.a.dims()[1]
    }

    /// The rank-`rank` layer closest to a trained dense one: `W ≈ U·Σ·Vᵀ` by the randomized
    /// SVD ([`RandomizedSvdConfig`], its default oversampling and power iterations), then
    /// `A = U·√Σ`, `B = √Σ·Vᵀ` (the factors balanced, so that neither starts far larger than
    /// the other), and the bias copied. By Eckart–Young, no layer of that rank has a weight
    /// closer to `W` in Frobenius norm than the truncated SVD's, which the randomized one
    /// approaches.
    ///
    /// # Errors
    /// As [`RandomizedSvdConfig::decompose`]: `rank` outside `1..=min(d_input, d_output)`,
    /// non-finite weights.
    pub fn try_from_linear(linear: &Linear<B>, rank: usize) -> Result<Self, CompressError> {
        // Detached, as in `SkLinear::try_from_linear`: the factors are fresh leaves.
        let weight = linear.weight.val().detach().set_require_grad(false);
        let svd = RandomizedSvdConfig::new(rank).decompose(weight)?;
        let root = svd.s.sqrt().unsqueeze_dim::<2>(0);
        Ok(Self {
            a: Param::from_tensor(svd.u * root.clone()),
            b: Param::from_tensor((svd.v * root).transpose()),
            bias: linear
                .bias
                .as_ref()
                .map(|bias| Param::from_tensor(bias.val())),
        })
    }

    /// The rank-`rank` layer whose outputs are closest to the dense layer's on sample inputs,
    /// rather than whose weight is closest: it minimises `‖X·(W − A·B)‖` where `gram = XᵀX`
    /// (`[d_input, d_input]`, summed over the inputs `X` the layer sees). A pretrained weight
    /// is far from low-rank, but its inputs use few directions strongly; this spends the rank
    /// on those. With `G = L·Lᵀ` (Cholesky) and `Lᵀ·W = U·Σ·Vᵀ` truncated to `rank`,
    /// `A = L⁻ᵀ·U·√Σ` and `B = √Σ·Vᵀ`; `G` gets a ridge of 10⁻⁶ of its mean diagonal, so
    /// inputs that span fewer than `d_input` directions still factor. On the host, in `f64`.
    ///
    /// # Errors
    /// [`CompressError::InvalidConfig`] for `rank` outside `1..=min(d_input, d_output)`,
    /// [`CompressError::ShapeMismatch`] for a `gram` that is not `[d_input, d_input]`,
    /// [`CompressError::Linalg`] for non-finite values.
    pub fn try_from_linear_on_inputs(
        linear: &Linear<B>,
        rank: usize,
        gram: Tensor<B, 2>,
    ) -> Result<Self, CompressError> {
        let [d_in, d_out] = linear.weight.dims();
        if rank == 0 || rank > d_in.min(d_out) {
            return Err(CompressError::InvalidConfig {
                name: "rank",
                value: rank,
                reason: "must be in 1..=min(d_input, d_output)",
            });
        }
        if gram.dims() != [d_in, d_in] {
            return Err(CompressError::ShapeMismatch {
                key: "gram".into(),
                found: gram.dims().to_vec(),
                expected: format!("[{d_in}, {d_in}] (d_input squared)"),
            });
        }
        let device = linear.weight.device();
        let operation = "activation-aware low-rank conversion";
        let w = host::to_host(linear.weight.val().detach(), operation)?;
        let mut g = host::to_host(gram.detach(), operation)?;
        let ridge = 1e-6 * (0..d_in).map(|i| g[(i, i)]).sum::<f64>() / d_in as f64;
        (0..d_in).for_each(|i| g[(i, i)] += ridge.max(f64::MIN_POSITIVE));
        let l = g
            .llt(Side::Lower)
            .map_err(|_| LinalgError::NonFinite { operation })?
            .L()
            .to_owned();
        let svd = (l.transpose() * &w)
            .thin_svd()
            .map_err(|_| LinalgError::NonFinite { operation })?;
        let (u, s, v) = (svd.U(), svd.S().column_vector(), svd.V());
        let mut a = Mat::<f64>::from_fn(d_in, rank, |i, t| u[(i, t)] * s[t].sqrt());
        solve_upper_triangular_in_place(l.transpose(), a.as_mut(), Par::Seq);
        let b = Mat::<f64>::from_fn(rank, d_out, |t, j| s[t].sqrt() * v[(j, t)]);
        Ok(Self {
            a: Param::from_tensor(host::to_device(a.as_ref(), &device)),
            b: Param::from_tensor(host::to_device(b.as_ref(), &device)),
            bias: linear
                .bias
                .as_ref()
                .map(|bias| Param::from_tensor(bias.val().detach())),
        })
    }

    /// Trained weights: both factors and the bias.
    pub fn num_trainable(&self) -> usize {
        self.rank() * (self.d_input() + self.d_output())
            + self.bias.as_ref().map_or(0, |_| self.d_output())
    }
}

impl<B: Backend> ModuleDisplay for LowRankLinear<B> {
    fn custom_settings(&self) -> Option<DisplaySettings> {
        DisplaySettings::new()
            .with_new_line_after_attribute(false)
            .optional()
    }

    fn custom_content(&self, content: Content) -> Option<Content> {
        content
            .add("d_input", &self.d_input())
            .add("d_output", &self.d_output())
            .add("rank", &self.rank())
            .add("bias", &self.bias.is_some())
            .optional()
    }
}
