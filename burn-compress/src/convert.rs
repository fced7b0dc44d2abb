//! Sketching the layers of a trained model: [`Converter`] turns the dense [`AnyLinear`]s a
//! [`Selection`] picks into sketched ones, anywhere in a model built from them.
//!
//! Burn's types are static and its [`ModuleMapper`] replaces parameter values, never modules.
//! The converter therefore runs a mapper that only tracks the module path, and each
//! [`AnyLinear`] it meets asks (in its own `map`) whether the active conversion picks its path;
//! the answer comes through a thread-local set for the duration of [`Converter::apply`]. Any
//! model that derives `Module` over `AnyLinear` fields (in structs, `Vec`s, `Option`s, enums)
//! converts with no code of its own.

use std::cell::RefCell;
use std::fmt;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::quantization::QuantLevel;
use burn::tensor::{Bool, DType, Int, Tensor};
use serde::{Deserialize, Serialize};

use super::{AnyLinear, LinearKind};
use burn_sketch::SketchInit;

use crate::CompressError;

/// The container type Burn's derive gives [`LinearLayer`](super::LinearLayer): meeting it marks
/// an [`AnyLinear`] during a visit.
const LAYER_CONTAINER: &str = "Enum:LinearLayer";

/// Which [`AnyLinear`] layers of a model a rule applies to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Selection {
    /// Every layer.
    All,
    /// Layers at these module paths (`"blocks.0.attention.query"`), or under them
    /// (`"blocks.0"` picks every layer of the first block). A `*` segment matches any one
    /// segment: `"blocks.*.mlp"` picks the MLP layers of every block.
    Paths(Vec<String>),
    /// Layers inside a module of one of these types (the struct's name, as `Module`'s derive
    /// reports it: `"AnyMultiHeadAttention"`, `"Mlp"`).
    Types(Vec<String>),
}

impl Selection {
    /// [`Selection::Paths`] from anything string-like.
    pub fn paths<S: Into<String>>(paths: impl IntoIterator<Item = S>) -> Self {
        Self::Paths(paths.into_iter().map(Into::into).collect())
    }

    /// [`Selection::Types`] from anything string-like.
    pub fn types<S: Into<String>>(types: impl IntoIterator<Item = S>) -> Self {
        Self::Types(types.into_iter().map(Into::into).collect())
    }

    /// Which of this selection's patterns pick the layer at `path` inside modules of `types`
    /// (one flag per pattern; `All` has one pattern).
    fn matches(&self, path: &str, types: &[String]) -> Vec<bool> {
        match self {
            Self::All => vec![true],
            Self::Paths(patterns) => patterns
                .iter()
                .map(|pattern| path_matches(pattern, path))
                .collect(),
            Self::Types(names) => names.iter().map(|name| types.contains(name)).collect(),
        }
    }

    fn patterns(&self) -> Vec<String> {
        match self {
            Self::All => vec!["<all>".into()],
            Self::Paths(p) | Self::Types(p) => p.clone(),
        }
    }
}

/// If `pattern` names `path` or a module above it, segment by segment, `*` matching any one.
fn path_matches(pattern: &str, path: &str) -> bool {
    let pattern: Vec<&str> = pattern.split('.').filter(|s| !s.is_empty()).collect();
    let path: Vec<&str> = path.split('.').collect();
    pattern.len() <= path.len()
        && pattern
            .iter()
            .zip(&path)
            .all(|(want, have)| *want == "*" || want == have)
}

/// A layer of a model, as [`Converter::layers`] lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerInfo {
    /// Module path (`"blocks.1.mlp.fc1"`).
    pub path: String,
    /// Types of the modules around it, outermost first.
    pub types: Vec<String>,
    /// What the layer is now.
    pub kind: LinearKind,
    /// Its trainable parameters.
    pub trainable: usize,
}

/// One layer a conversion changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvertedLayer {
    /// Module path.
    pub path: String,
    /// Its kind before.
    pub from: LinearKind,
    /// Its kind after.
    pub to: LinearKind,
    /// Trainable parameters before.
    pub trainable_before: usize,
    /// Trainable parameters after.
    pub trainable_after: usize,
    /// Bytes the layer's tensors held before ([`stored_bytes`]).
    pub bytes_before: usize,
    /// Bytes they hold after.
    pub bytes_after: usize,
}

/// What [`Converter::apply`] did: every converted layer, in module order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversionReport {
    /// The converted layers.
    pub layers: Vec<ConvertedLayer>,
}

impl ConversionReport {
    /// Trainable parameters of the converted layers, before and after.
    pub fn trainable(&self) -> (usize, usize) {
        self.layers.iter().fold((0, 0), |(b, a), layer| {
            (b + layer.trainable_before, a + layer.trainable_after)
        })
    }

    /// Bytes the converted layers' tensors held, before and after.
    pub fn bytes(&self) -> (usize, usize) {
        self.layers.iter().fold((0, 0), |(b, a), layer| {
            (b + layer.bytes_before, a + layer.bytes_after)
        })
    }
}

impl fmt::Display for ConversionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "| layer | from | to | trainable before | after | bytes before | after |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|")?;
        for layer in &self.layers {
            writeln!(
                f,
                "| {} | {} | {} | {} | {} | {} | {} |",
                layer.path,
                layer.from,
                layer.to,
                layer.trainable_before,
                layer.trainable_after,
                layer.bytes_before,
                layer.bytes_after
            )?;
        }
        let (before, after) = self.trainable();
        let (bytes_before, bytes_after) = self.bytes();
        write!(
            f,
            "{} layers converted, {before} → {after} trainable parameters, \
             {bytes_before} → {bytes_after} bytes",
            self.layers.len()
        )
    }
}

/// Sketches the layers of a model that rules pick (the rules are tried in order; the first
/// that picks a layer decides its kind).
///
/// A dense layer becomes the [`SkLinear`](burn_sketch::SkLinear) that estimates it
/// ([`SkLinear::from_linear`](burn_sketch::SkLinear::from_linear)); layers no rule picks, and every
/// other tensor of the model, are kept as they are, bit for bit. The new parameters have new
/// ids: build the optimizer (or its state) after converting. The [crate docs](crate) have an
/// example; the book's "Transformers and conversion" chapter, the rules in full.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Converter {
    rules: Vec<(Selection, LinearKind)>,
    #[serde(default)]
    sketch_init: SketchInit,
}

impl Converter {
    /// A converter with no rules (it changes nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rule: the layers `selection` picks become `kind`.
    pub fn rule(mut self, selection: Selection, kind: LinearKind) -> Self {
        self.rules.push((selection, kind));
        self
    }

    /// How dense layers that become sketched set their trained factors (Panther's unbiased
    /// estimate by default; [`SketchInit::Fitted`] starts closer to the dense layer).
    pub fn sketch_init(mut self, init: SketchInit) -> Self {
        self.sketch_init = init;
        self
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[(Selection, LinearKind)] {
        &self.rules
    }

    /// Every [`AnyLinear`] of `model`, in module order.
    pub fn layers<B: Backend, M: Module<B>>(model: &M) -> Vec<LayerInfo> {
        let mut lister = Lister {
            stack: Vec::new(),
            layers: Vec::new(),
            _backend: std::marker::PhantomData::<B>,
        };
        model.visit(&mut lister);
        lister.layers
    }

    /// Converts `model`'s picked layers.
    ///
    /// Errors: a path or type pattern that picks no layer ([`CompressError::NoMatch`], naming
    /// it: a typo should not silently leave a model dense), an invalid kind (`k = 0`:
    /// [`CompressError::InvalidConfig`]), or a conversion that is not possible
    /// ([`CompressError::Unsupported`]). On error the model is not returned: it may be partly
    /// converted.
    pub fn apply<B: Backend, M: Module<B>>(
        &self,
        model: M,
    ) -> Result<(M, ConversionReport), CompressError> {
        let layers = Self::layers::<B, M>(&model);
        for (selection, _) in &self.rules {
            let hits =
                layers
                    .iter()
                    .fold(vec![false; selection.patterns().len()], |hits, layer| {
                        let now = selection.matches(&layer.path, &layer.types);
                        hits.iter().zip(now).map(|(a, b)| *a || b).collect()
                    });
            if let Some(missing) = hits.iter().position(|hit| !hit) {
                return Err(CompressError::NoMatch {
                    pattern: selection.patterns()[missing].clone(),
                    layers: layers.iter().map(|l| l.path.clone()).collect(),
                });
            }
        }
        let previous = ACTIVE.with(|active| {
            active.replace(Some(Active {
                rules: self.rules.clone(),
                sketch_init: self.sketch_init,
                stack: Vec::new(),
                report: ConversionReport::default(),
                error: None,
            }))
        });
        // Restores the previous state also when a backend panics mid-conversion.
        let guard = Restore(previous);
        let model = model.map(&mut PathTracker {
            _backend: std::marker::PhantomData::<B>,
        });
        let active = ACTIVE.with(RefCell::take);
        drop(guard);
        let active = active.expect("the conversion state was set above");
        match active.error {
            Some(error) => Err(error),
            None => Ok((model, active.report)),
        }
    }
}

struct Active {
    rules: Vec<(Selection, LinearKind)>,
    sketch_init: SketchInit,
    stack: Vec<(String, String)>,
    report: ConversionReport,
    error: Option<CompressError>,
}

thread_local! {
    static ACTIVE: RefCell<Option<Active>> = const { RefCell::new(None) };
}

/// Puts the thread's previous conversion state back when dropped.
struct Restore(Option<Active>);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0.take();
        ACTIVE.with(|active| active.replace(previous));
    }
}

/// Called by [`AnyLinear`]'s `map`: the layer converted, if a conversion is active on this
/// thread and one of its rules picks the layer's path; the layer unchanged otherwise.
pub(super) fn convert_in_place<B: Backend>(layer: AnyLinear<B>) -> AnyLinear<B> {
    let decision = ACTIVE.with(|active| {
        let active = active.borrow();
        let active = active.as_ref()?;
        if active.error.is_some() {
            return None;
        }
        let path = path_of(&active.stack);
        let types = types_of(&active.stack);
        active
            .rules
            .iter()
            .find(|(selection, _)| selection.matches(&path, &types).contains(&true))
            .map(|&(_, kind)| (path, kind, active.sketch_init))
    });
    let Some((path, kind, init)) = decision else {
        return layer;
    };
    let from = layer.kind();
    if from == kind {
        return layer;
    }
    let before = layer.num_trainable();
    let bytes_before = stored_bytes::<B, _>(&layer);
    let (keep, outcome) = match layer.clone().try_convert_with(kind, init) {
        Ok(converted) => (converted, Ok(())),
        Err(error) => (layer, Err(error)),
    };
    ACTIVE.with(|active| {
        let mut active = active.borrow_mut();
        let active = active.as_mut().expect("checked above");
        match outcome {
            Ok(()) => active.report.layers.push(ConvertedLayer {
                path,
                from,
                to: kind,
                trainable_before: before,
                trainable_after: keep.num_trainable(),
                bytes_before,
                bytes_after: stored_bytes::<B, _>(&keep),
            }),
            Err(error) => active.error = Some(error),
        }
    });
    keep
}

/// Bytes `module`'s tensors hold, by their element types: four per `f32` value, two per
/// `f16`/`bf16` one, one per `int8` weight plus four per `int8` tensor's scale. A sketch kept
/// as a seed ([`FixedSketch`](burn_sketch::FixedSketch)) is counted: it is held in memory,
/// though its record holds only the seed.
///
/// ```
/// use burn::{backend::Flex, nn::LinearConfig};
/// let layer = LinearConfig::new(10, 4).init::<Flex>(&Default::default());
/// assert_eq!(burn_compress::stored_bytes::<Flex, _>(&layer), 4 * (10 * 4 + 4));
/// ```
pub fn stored_bytes<B: Backend, M: Module<B>>(module: &M) -> usize {
    struct Bytes(usize);
    impl<B: Backend> ModuleVisitor<B> for Bytes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let tensor = param.val();
            let elements = tensor.shape().num_elements();
            self.0 += match tensor.dtype() {
                // Values and one scale per quantization block (one for a per-tensor scheme).
                DType::QFloat(scheme) => {
                    let blocks = match scheme.level {
                        QuantLevel::Tensor => 1,
                        QuantLevel::Block(size) => elements.div_ceil(size.num_elements().max(1)),
                    };
                    elements * scheme.value.size_bits() / 8 + 4 * blocks
                }
                dtype => elements * dtype.size(),
            };
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
            self.0 += param.val().shape().num_elements() * param.val().dtype().size();
        }
        fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
            self.0 += param.val().shape().num_elements();
        }
    }
    let mut bytes = Bytes(0);
    module.visit(&mut bytes);
    bytes.0
}

fn path_of(stack: &[(String, String)]) -> String {
    stack
        .iter()
        .map(|(name, _)| name.as_str())
        .collect::<Vec<_>>()
        .join(".")
}

/// Struct names of the containers on the stack (`"Struct:Mlp"` gives `"Mlp"`).
fn types_of(stack: &[(String, String)]) -> Vec<String> {
    stack
        .iter()
        .filter_map(|(_, container)| container.strip_prefix("Struct:").map(String::from))
        .collect()
}

/// The mapper [`Converter::apply`] runs: it changes no parameter, and keeps the thread's
/// conversion state's path current for [`convert_in_place`].
struct PathTracker<B> {
    _backend: std::marker::PhantomData<B>,
}

impl<B: Backend> ModuleMapper<B> for PathTracker<B> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        ACTIVE.with(|active| {
            if let Some(active) = active.borrow_mut().as_mut() {
                active.stack.push((name.into(), container_type.into()));
            }
        });
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        ACTIVE.with(|active| {
            if let Some(active) = active.borrow_mut().as_mut() {
                active.stack.pop();
            }
        });
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        param
    }
}

/// Lists the [`AnyLinear`]s of a model: each is where the visit enters a `LinearLayer`
/// variant, and its sizes come from the parameters visited inside it.
struct Lister<B> {
    stack: Vec<(String, String)>,
    layers: Vec<LayerInfo>,
    _backend: std::marker::PhantomData<B>,
}

impl<B: Backend> ModuleVisitor<B> for Lister<B> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.stack.push((name.into(), container_type.into()));
        if container_type == LAYER_CONTAINER {
            let outer = &self.stack[..self.stack.len() - 1];
            self.layers.push(LayerInfo {
                path: path_of(outer),
                types: types_of(outer),
                kind: LinearKind::Dense,
                trainable: 0,
            });
        }
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.stack.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        // Inside a layer variant: the stack ends with [variant, field].
        let Some(at) = self
            .stack
            .iter()
            .rposition(|(_, container)| container == LAYER_CONTAINER)
        else {
            return;
        };
        let (variant, field) = (&self.stack[at].0, self.stack.get(at + 1).map(|s| &s.0));
        let layer = self.layers.last_mut().expect("entered a layer variant");
        let dims = param.dims();
        let elements: usize = dims.iter().product();
        match (variant.as_str(), field.map(String::as_str)) {
            ("Sketched", Some("s1s")) => {
                layer.kind = LinearKind::Sketched {
                    num_terms: dims[0],
                    low_rank: dims[2],
                };
                layer.trainable += elements;
            }
            ("Sketched", Some("u1s" | "u2s")) => {}
            ("LowRank", Some("a")) => {
                layer.kind = LinearKind::LowRank { rank: dims[1] };
                layer.trainable += elements;
            }
            // Nothing of an int8 layer trains.
            ("Int8", _) => layer.kind = LinearKind::Int8,
            _ => layer.trainable += elements,
        }
    }
}
