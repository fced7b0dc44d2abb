//! `cargo backend-ops`: generates the forwarding of Burn's operation traits
//! (`FloatTensorOps`, `IntTensorOps`, `BoolTensorOps`, `ModuleOps`, `ActivationOps`,
//! `QTensorOps`) for the project's two backend decorators ([`TARGETS`]): burn-profiler's
//! profiling backend `Profiled<B>` and burn-sketch's `HalfFlex`.
//!
//! Why generated: a decorator must forward every method of these traits to its inner
//! backend's, those with a default implementation included. A method left to its default would
//! decompose the operation into others (`float_neg` into a multiplication, `conv1d` into a
//! `conv2d`) and so bypass the inner backend's own kernel: a profile would show operations the
//! backend never runs, and the decorated model would compute differently. The traits hold 417
//! methods in burn-backend 0.21.0 and change between Burn releases; written by hand, a
//! forgotten method compiles silently (it has a default). So the forwarding is generated from
//! burn-backend's own sources, found through `cargo metadata`: every `fn` of the six traits,
//! with its signature (the trait's backend parameter becomes `Self`, whose associated types
//! are the inner backend's) and a body that depends on the target ([`Body`]).
//!
//! The test `generated_forwarding_is_current` runs the generator and compares its output with
//! the committed files byte for byte, so a Burn upgrade or a change here that is not
//! regenerated fails `cargo test -p backend-ops`; another test checks that every trait method
//! was emitted. The generator is a crate of its own that links none of the crates it writes
//! into: after a Burn upgrade that breaks a generated file, it still builds and regenerates it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};
use proc_macro2::{Group, Ident, Punct, Spacing, Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote};
use syn::visit::Visit;
use syn::{
    FnArg, GenericArgument, GenericParam, Item, Pat, PathArguments, ReturnType, TraitItem,
    TraitItemFn, Type, TypeParamBound, UseTree, Visibility,
};

/// The traits whose methods are forwarded, in the order their impls are written.
pub const TRAITS: [&str; 6] = [
    "FloatTensorOps",
    "IntTensorOps",
    "BoolTensorOps",
    "ModuleOps",
    "ActivationOps",
    "QTensorOps",
];

/// The files of burn-backend (relative to its `src`) that hold the traits.
const TRAIT_FILES: [&str; 5] = [
    "backend/ops/tensor.rs",
    "backend/ops/int_tensor.rs",
    "backend/ops/bool_tensor.rs",
    "backend/ops/activation.rs",
    "backend/ops/qtensor.rs",
];
/// The folder whose every file is searched too (`ModuleOps` is in its `base.rs`).
const TRAIT_DIR: &str = "backend/ops/modules";

/// A backend decorator whose operation traits are generated.
pub struct Target {
    /// The generated file, relative to the workspace root.
    pub output: &'static str,
    /// The implementing type and its impl generics (`impl<B: Backend> … for Profiled<B>`).
    implementor: &'static str,
    generics: &'static str,
    /// The file's doc comment, before the lines on how it is generated.
    doc: &'static str,
    /// `use` lines of the file's own crate.
    uses: &'static str,
    body: Body,
}

/// What each generated method does.
enum Body {
    /// Records the call around `B`'s method (`Profiled<B>`).
    Record,
    /// Calls the method of the backend named `to` (defined in `package`) where that backend
    /// implements the method itself; a method it leaves to the trait's default is left to the
    /// default here too, so that its decomposition runs on this backend's operations (Burn's
    /// `linear` on this backend's `float_matmul`). The `via_f32` methods, given a float
    /// tensor in a half-precision type (`super::half_dtype`), run `to`'s method on `f32`
    /// copies of their float tensors (`super::to_f32`) and round a float output back
    /// (`super::from_f32`); the `own` methods call the parent module's function of the same
    /// name.
    Forward {
        to: &'static str,
        package: &'static str,
        via_f32: &'static [&'static str],
        own: &'static [&'static str],
    },
}

/// The generated files.
pub const TARGETS: [Target; 2] = [
    Target {
        output: "burn-profiler/src/ops.rs",
        implementor: "Profiled<B>",
        generics: "<B: Backend>",
        doc: "//! The forwarding of Burn's operation traits for [`Profiled<B>`]: every method calls `B`'s\n\
              //! and records the call ([`Call`]), with the tensors it reads and writes.\n",
        uses: "use super::backend::Profiled;\nuse super::record::{Call, desc};\n",
        body: Body::Record,
    },
    Target {
        output: "burn-sketch/src/cpu/half_flex/ops.rs",
        implementor: "HalfFlex",
        generics: "",
        doc: "//! The forwarding of Burn's operation traits for [`HalfFlex`]: every method calls Flex's,\n\
              //! except that the arithmetic of half-precision tensors runs as `f32` (converted by\n\
              //! [`to_f32`](super::to_f32), rounded back by [`from_f32`](super::from_f32)) and that\n\
              //! the parent module writes `float_matmul` and `float_cast` itself. A method that Flex\n\
              //! leaves to the trait's default is left to it here too, so that its decomposition\n\
              //! runs on `HalfFlex`'s operations (Burn's `linear` on its `float_matmul`).\n",
        uses: "use burn::backend::Flex;\n\nuse super::HalfFlex;\n",
        body: Body::Forward {
            to: "Flex",
            package: "burn-flex",
            via_f32: HALF_VIA_F32,
            own: &["float_matmul", "float_cast"],
        },
    },
];

/// The operations `HalfFlex` runs in `f32` for `bf16` and `f16` tensors: arithmetic,
/// reductions, comparisons and activations, which Flex 0.21 computes one value at a time
/// through `half`'s scalar conversions. Operations that only move values (reshape, slice,
/// gather, cat, mask, …) are Flex's, in any type.
const HALF_VIA_F32: &[&str] = &[
    "float_add",
    "float_add_scalar",
    "float_clamp_min",
    "float_clamp_max",
    "float_clamp",
    "float_sub",
    "float_sub_scalar",
    "float_mul",
    "float_mul_scalar",
    "float_div",
    "float_div_scalar",
    "float_remainder",
    "float_remainder_scalar",
    "float_cross",
    "float_neg",
    "float_recip",
    "float_equal",
    "float_not_equal",
    "float_equal_elem",
    "float_not_equal_elem",
    "float_greater",
    "float_greater_elem",
    "float_greater_equal",
    "float_greater_equal_elem",
    "float_lower",
    "float_lower_elem",
    "float_lower_equal",
    "float_lower_equal_elem",
    "float_sum",
    "float_sum_dim",
    "float_prod",
    "float_prod_dim",
    "float_mean",
    "float_mean_dim",
    "float_cumsum",
    "float_cumprod",
    "float_cummin",
    "float_cummax",
    "float_exp",
    "float_log",
    "float_log1p",
    "float_powf",
    "float_powi",
    "float_powi_scalar",
    "float_powf_scalar",
    "float_sqrt",
    "float_abs",
    "float_cos",
    "float_sin",
    "float_tan",
    "float_cosh",
    "float_sinh",
    "float_tanh",
    "float_acos",
    "float_acosh",
    "float_asin",
    "float_asinh",
    "float_atan",
    "float_atanh",
    "float_atan2",
    "float_round",
    "float_floor",
    "float_ceil",
    "float_trunc",
    "float_erf",
    "float_argmax",
    "float_argmin",
    "float_max",
    "float_max_dim",
    "float_min",
    "float_min_dim",
    "float_max_abs",
    "float_max_abs_dim",
    "float_any",
    "float_any_dim",
    "float_all",
    "float_all_dim",
    "float_sign",
    "float_is_nan",
    "float_is_inf",
    "leaky_relu",
    "relu",
    "relu_backward",
    "gelu",
    "prelu",
    "gelu_backward",
    "sigmoid",
    "sigmoid_backward",
    "hard_sigmoid",
    "log_sigmoid",
    "softmax",
    "log_softmax",
    "softmin",
    "log_sigmoid_backward",
];

/// Names in the Rust 2024 prelude (and primitive types): never imported.
const PRELUDE: &[&str] = &[
    "Option",
    "Some",
    "None",
    "Result",
    "Ok",
    "Err",
    "Vec",
    "String",
    "Box",
    "Send",
    "Sync",
    "Sized",
    "Unpin",
    "Copy",
    "Clone",
    "Default",
    "Drop",
    "Fn",
    "FnMut",
    "FnOnce",
    "Future",
    "IntoFuture",
    "Iterator",
    "IntoIterator",
    "DoubleEndedIterator",
    "ExactSizeIterator",
    "Extend",
    "FromIterator",
    "From",
    "Into",
    "TryFrom",
    "TryInto",
    "AsRef",
    "AsMut",
    "PartialEq",
    "Eq",
    "PartialOrd",
    "Ord",
    "ToOwned",
    "ToString",
    "bool",
    "char",
    "str",
    "f32",
    "f64",
    "i8",
    "i16",
    "i32",
    "i64",
    "i128",
    "isize",
    "u8",
    "u16",
    "u32",
    "u64",
    "u128",
    "usize",
    "Self",
];

/// The four tensor primitives of a backend, by the associated type that names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TensorKind {
    Float,
    Int,
    Bool,
    Quantized,
}

impl TensorKind {
    fn from_assoc(assoc: &str) -> Option<Self> {
        match assoc {
            "FloatTensorPrimitive" => Some(Self::Float),
            "IntTensorPrimitive" => Some(Self::Int),
            "BoolTensorPrimitive" => Some(Self::Bool),
            "QuantizedTensorPrimitive" => Some(Self::Quantized),
            _ => None,
        }
    }

    /// The backend method giving a tensor's device.
    fn device_method(self) -> &'static str {
        match self {
            Self::Float => "float_device",
            Self::Int => "int_device",
            Self::Bool => "bool_device",
            Self::Quantized => "q_device",
        }
    }
}

/// A container of zero or more tensors, described element by element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    Vec,
    Slice,
    Option,
}

/// What a parameter or return type holds, as far as recording and conversion are concerned.
#[derive(Debug, Clone)]
enum Value {
    /// A tensor primitive, by value.
    Tensor(TensorKind),
    /// A reference to a tensor primitive.
    TensorRef,
    /// A `Vec`, slice reference or `Option` of tensor primitives.
    Many(Container, TensorKind),
    /// A tuple holding tensors.
    Tuple(Vec<Value>),
    /// A struct generic over the backend, whose fields are rebuilt for the other backend.
    Struct {
        name: Ident,
        fields: Vec<(Ident, Value)>,
    },
    /// An enum generic over the backend, rebuilt variant by variant for the other backend.
    Enum {
        name: Ident,
        variants: Vec<(Ident, Fields)>,
    },
    /// `impl Future<...>`, returned unchanged.
    Future,
    /// `()`.
    Unit,
    /// Anything else: no tensor, and the same type for `B` and `Profiled<B>`.
    Other,
}

/// The fields of an enum variant.
#[derive(Debug, Clone)]
enum Fields {
    Named(Vec<(Ident, Value)>),
    Unnamed(Vec<Value>),
    Unit,
}

impl Fields {
    /// The variant's pattern binding every field (`V(f0, f1)`, `V { a, b }`, `V`), and the
    /// bindings with their values.
    fn pattern(&self, path: TokenStream) -> (TokenStream, Vec<(Ident, &Value)>) {
        match self {
            Fields::Named(fields) => {
                let names = fields.iter().map(|(name, _)| name);
                let pattern = quote!(#path { #(#names),* });
                let bindings = fields.iter().map(|(name, v)| (name.clone(), v)).collect();
                (pattern, bindings)
            }
            Fields::Unnamed(fields) => {
                let bindings: Vec<_> = fields
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (format_ident!("f{i}"), v))
                    .collect();
                let names = bindings.iter().map(|(name, _)| name);
                (quote!(#path(#(#names),*)), bindings)
            }
            Fields::Unit => (path, Vec::new()),
        }
    }
}

impl Value {
    /// Whether the value's type differs between `B` and `Profiled<B>` (it holds a struct or
    /// an enum generic over the backend), so that it must be rebuilt.
    fn needs_conversion(&self) -> bool {
        match self {
            Value::Struct { .. } | Value::Enum { .. } => true,
            Value::Tuple(items) => items.iter().any(Value::needs_conversion),
            _ => false,
        }
    }
}

/// A parsed file of burn-backend.
struct SourceFile {
    /// Its module path, without the crate (`["backend", "ops", "tensor"]`).
    module: Vec<String>,
    ast: syn::File,
    /// Names brought in by its `use` items, with the path as written.
    uses: BTreeMap<String, Vec<String>>,
    /// Whether it has a glob `use` (a name resolved nowhere else may come from it).
    has_glob: bool,
    /// Names of the items it defines at top level.
    defined: BTreeSet<String>,
}

/// A struct generic over the backend whose fields are all public, or an enum generic over
/// the backend.
struct BackendType {
    param: String,
    shape: TypeShape,
}

enum TypeShape {
    Struct(Vec<(Ident, Type)>),
    Enum(Vec<(Ident, syn::Fields)>),
}

/// burn-backend's sources, parsed.
struct Crate {
    version: String,
    /// By module path.
    files: BTreeMap<Vec<String>, SourceFile>,
    /// Type aliases `Alias<B> = <B as BackendTypes>::Assoc` (`FloatTensor`, `Device`), by
    /// alias name: the associated type.
    aliases: BTreeMap<String, String>,
    /// Structs and enums generic over the backend, by name; `None` where two share a name.
    types: BTreeMap<String, Option<BackendType>>,
}

/// What [`generate`] produced.
pub struct Generated {
    /// The formatted file.
    pub code: String,
    /// burn-backend's version.
    pub version: String,
    /// Methods emitted per trait, in [`TRAITS`] order.
    pub counts: Vec<(String, usize)>,
    /// Methods each trait declares, per trait, as read from its source.
    pub declared: Vec<(String, Vec<String>)>,
    /// Methods left to the trait's default, per trait ([`Body::Forward`]).
    pub defaulted: Vec<(String, Vec<String>)>,
}

/// The `(trait, method)` pairs that `package` implements itself for its type `to`: the `fn`s
/// of its `impl Trait<To> for To` blocks, in every source file.
fn own_methods(root: &Path, package: &str, to: &str) -> Result<BTreeSet<(String, String)>> {
    let (src, _) = package_src(root, package)?;
    let mut found = BTreeSet::new();
    let mut stack = vec![src];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("{}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("could not read {}", path.display()))?;
            let ast = syn::parse_file(&text)
                .with_context(|| format!("could not parse {}", path.display()))?;
            collect_own(&ast.items, to, &mut found);
        }
    }
    ensure!(
        !found.is_empty(),
        "{package} implements no operation trait for {to}"
    );
    Ok(found)
}

fn collect_own(items: &[Item], to: &str, found: &mut BTreeSet<(String, String)>) {
    for item in items {
        match item {
            Item::Impl(block) => {
                let Some((_, path, _)) = &block.trait_ else {
                    continue;
                };
                let trait_name = path.segments.last().expect("a path").ident.to_string();
                let for_to = matches!(&*block.self_ty, Type::Path(p)
                    if p.path.segments.last().is_some_and(|s| s.ident == to));
                if !for_to || !TRAITS.contains(&trait_name.as_str()) {
                    continue;
                }
                for item in &block.items {
                    if let syn::ImplItem::Fn(f) = item {
                        found.insert((trait_name.clone(), f.sig.ident.to_string()));
                    }
                }
            }
            Item::Mod(module) => {
                if let Some((_, items)) = &module.content {
                    collect_own(items, to, found);
                }
            }
            _ => {}
        }
    }
}

/// Runs `cargo backend-ops`: writes the files and prints the method counts.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("backend-ops failed: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Writes every target's file and prints what each trait got.
pub fn run() -> Result<()> {
    let root = workspace_root();
    for target in &TARGETS {
        let generated = generate(&root, target)?;
        let per_trait = generated.counts.iter().zip(&generated.declared);
        for (((name, count), (_, declared)), (_, left)) in per_trait.zip(&generated.defaulted) {
            ensure!(
                count + left.len() == declared.len(),
                "{name}: {count} methods emitted and {} left to the default, {} declared",
                left.len(),
                declared.len()
            );
        }
        let out = root.join(target.output);
        std::fs::write(&out, &generated.code)
            .with_context(|| format!("could not write {}", out.display()))?;
        let total: usize = generated.counts.iter().map(|(_, count)| count).sum();
        let left: usize = generated.defaulted.iter().map(|(_, left)| left.len()).sum();
        println!(
            "{}: {total} methods ({}), {left} left to the traits' defaults, from burn-backend {}, \
             written to {}",
            target.implementor,
            generated
                .counts
                .iter()
                .map(|(name, count)| format!("{name} {count}"))
                .collect::<Vec<_>>()
                .join(", "),
            generated.version,
            out.display()
        );
    }
    Ok(())
}

/// The workspace root (two folders above this crate's).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("xtask/backend-ops is inside the workspace")
        .to_path_buf()
}

/// Generates the file's formatted text from the burn-backend that `root`'s workspace uses.
pub fn generate(root: &Path, target: &Target) -> Result<Generated> {
    let (src, version) = burn_backend_src(root)?;
    let krate = Crate::load(&src, version)?;
    let mut imports = Imports::default();
    if matches!(target.body, Body::Record) {
        imports.add("Backend", vec!["burn_backend".into(), "Backend".into()])?;
    }
    let overridden = match target.body {
        Body::Record => None,
        Body::Forward { to, package, .. } => Some(own_methods(root, package, to)?),
    };
    let mut impls = Vec::new();
    let mut counts = Vec::new();
    let mut declared = Vec::new();
    let mut defaulted = Vec::new();
    let mut found = BTreeMap::new();
    for file in krate.files.values() {
        if !krate.is_trait_file(&file.module) {
            continue;
        }
        for item in &file.ast.items {
            if let Item::Trait(item) = item
                && TRAITS.contains(&item.ident.to_string().as_str())
            {
                ensure!(
                    matches!(item.vis, Visibility::Public(_)),
                    "trait {} is not public",
                    item.ident
                );
                if found.insert(item.ident.to_string(), (file, item)).is_some() {
                    bail!("trait {} is defined twice in burn-backend", item.ident);
                }
            }
        }
    }
    for name in TRAITS {
        let (file, item) = found
            .get(name)
            .with_context(|| format!("trait {name} not found in burn-backend's sources"))?;
        let (tokens, methods, left) =
            krate.trait_impl(file, item, target, overridden.as_ref(), &mut imports)?;
        defaulted.push((name.to_owned(), left));
        counts.push((name.to_owned(), methods.len()));
        impls.push(tokens);
        let names = item
            .items
            .iter()
            .filter_map(|item| match item {
                TraitItem::Fn(f) => Some(f.sig.ident.to_string()),
                _ => None,
            })
            .collect();
        declared.push((name.to_owned(), names));
    }
    let header = format!(
        "{}//!\n\
         //! Generated by `cargo backend-ops` from burn-backend {}'s sources\n\
         //! (`src/backend/ops`). Do not edit by hand: change the generator\n\
         //! (`xtask/backend-ops/src/main.rs`) and run `cargo backend-ops` again;\n\
         //! `cargo test -p backend-ops` fails when this file is not what it writes.\n\n",
        target.doc, krate.version
    );
    let unformatted = format!(
        "{header}{}\n{}\n{}",
        imports.text(),
        target.uses,
        impls.join("\n")
    );
    let code = rustfmt(&unformatted, &root.join(target.output))?;
    Ok(Generated {
        code,
        version: krate.version,
        counts,
        declared,
        defaulted,
    })
}

/// burn-backend's `src` folder and version, from `cargo metadata`.
fn burn_backend_src(root: &Path) -> Result<(PathBuf, String)> {
    package_src(root, "burn-backend")
}

/// A package's `src` folder and version, from `cargo metadata` (the workspace must use
/// exactly one version of it).
fn package_src(root: &Path, name: &str) -> Result<(PathBuf, String)> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .context("could not run `cargo metadata`")?;
    ensure!(
        output.status.success(),
        "`cargo metadata` failed ({})",
        output.status
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("`cargo metadata` printed no JSON")?;
    let packages: Vec<_> = metadata["packages"]
        .as_array()
        .context("`cargo metadata` lists no packages")?
        .iter()
        .filter(|package| package["name"] == name)
        .collect();
    let [package] = packages.as_slice() else {
        bail!(
            "the workspace should use exactly one {name}, it uses {}",
            packages.len()
        );
    };
    let manifest = package["manifest_path"]
        .as_str()
        .with_context(|| format!("{name} has no manifest_path"))?;
    let version = package["version"]
        .as_str()
        .with_context(|| format!("{name} has no version"))?;
    let src = Path::new(manifest)
        .parent()
        .with_context(|| format!("{name}'s manifest path has no folder"))?
        .join("src");
    ensure!(
        src.is_dir(),
        "{name}'s sources are not at {} (run `cargo fetch`)",
        src.display()
    );
    Ok((src, version.to_owned()))
}

/// Formats `code` with `rustfmt --edition 2024`, run where the generated file `output` lies
/// (so that it finds the configuration `cargo fmt` would).
fn rustfmt(code: &str, output: &Path) -> Result<String> {
    let dir = output.parent().expect("the output is in a folder");
    let mut child = Command::new("rustfmt")
        .args(["--edition", "2024"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("could not run rustfmt")?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let input = code.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().context("rustfmt did not finish")?;
    writer
        .join()
        .expect("the writer thread does not panic")
        .context("could not write to rustfmt")?;
    ensure!(
        output.status.success(),
        "rustfmt failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).context("rustfmt wrote non-UTF-8 text")
}

/// The `use` items of the generated file: name to absolute path.
#[derive(Default)]
struct Imports {
    names: BTreeMap<String, Vec<String>>,
}

impl Imports {
    fn add(&mut self, name: &str, path: Vec<String>) -> Result<()> {
        match self.names.get(name) {
            Some(known) if *known != path => bail!(
                "`{name}` means both `{}` and `{}` in burn-backend's traits",
                known.join("::"),
                path.join("::")
            ),
            _ => {
                self.names.insert(name.to_owned(), path);
                Ok(())
            }
        }
    }

    /// One `use` line per module, sorted.
    fn text(&self) -> String {
        let mut by_module: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (name, path) in &self.names {
            let (last, module) = path.split_last().expect("paths are not empty");
            let item = if last == name {
                name.clone()
            } else {
                format!("{last} as {name}")
            };
            by_module.entry(module.join("::")).or_default().insert(item);
        }
        let mut out = String::new();
        for (module, items) in by_module {
            let items: Vec<_> = items.into_iter().collect();
            if items.len() == 1 {
                out.push_str(&format!("use {module}::{};\n", items[0]));
            } else {
                out.push_str(&format!("use {module}::{{{}}};\n", items.join(", ")));
            }
        }
        out
    }
}

impl Crate {
    /// Parses every file under `src`.
    fn load(src: &Path, version: String) -> Result<Self> {
        let mut files = BTreeMap::new();
        let mut stack = vec![src.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir)
                .with_context(|| format!("could not list {}", dir.display()))?
            {
                let path = entry?.path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|ext| ext == "rs") {
                    let rel = path.strip_prefix(src).expect("under src");
                    let module = module_path(rel);
                    let text = std::fs::read_to_string(&path)
                        .with_context(|| format!("could not read {}", path.display()))?;
                    let ast = syn::parse_file(&text)
                        .with_context(|| format!("could not parse {}", path.display()))?;
                    files.insert(module.clone(), SourceFile::new(module, ast));
                }
            }
        }
        let mut krate = Self {
            version,
            files,
            aliases: BTreeMap::new(),
            types: BTreeMap::new(),
        };
        krate.collect_types();
        for file in TRAIT_FILES {
            ensure!(
                krate.files.contains_key(&module_path(Path::new(file))),
                "burn-backend has no src/{file}"
            );
        }
        Ok(krate)
    }

    /// Whether the module is one of the trait files.
    fn is_trait_file(&self, module: &[String]) -> bool {
        let dir = module_path(Path::new(&format!("{TRAIT_DIR}/mod.rs")));
        TRAIT_FILES
            .iter()
            .any(|file| module_path(Path::new(file)) == module)
            || (module.len() == dir.len() + 1 && module.starts_with(&dir))
            || (module == dir)
    }

    /// Collects the backend type aliases and the structs and enums generic over the backend.
    fn collect_types(&mut self) {
        for file in self.files.values() {
            for item in &file.ast.items {
                match item {
                    Item::Type(alias) if matches!(alias.vis, Visibility::Public(_)) => {
                        let Some(param) = single_type_param(&alias.generics) else {
                            continue;
                        };
                        if let Some(assoc) = assoc_of(&alias.ty, &param) {
                            self.aliases.insert(alias.ident.to_string(), assoc);
                        }
                    }
                    Item::Struct(item) if matches!(item.vis, Visibility::Public(_)) => {
                        let Some(param) = single_type_param(&item.generics) else {
                            continue;
                        };
                        let syn::Fields::Named(fields) = &item.fields else {
                            continue;
                        };
                        if !fields
                            .named
                            .iter()
                            .all(|field| matches!(field.vis, Visibility::Public(_)))
                        {
                            continue;
                        }
                        let fields = fields
                            .named
                            .iter()
                            .map(|field| (field.ident.clone().expect("named"), field.ty.clone()))
                            .collect();
                        let shape = TypeShape::Struct(fields);
                        add_type(
                            &mut self.types,
                            item.ident.to_string(),
                            BackendType { param, shape },
                        );
                    }
                    Item::Enum(item) if matches!(item.vis, Visibility::Public(_)) => {
                        let Some(param) = single_type_param(&item.generics) else {
                            continue;
                        };
                        let variants = item
                            .variants
                            .iter()
                            .map(|v| (v.ident.clone(), v.fields.clone()))
                            .collect();
                        let shape = TypeShape::Enum(variants);
                        add_type(
                            &mut self.types,
                            item.ident.to_string(),
                            BackendType { param, shape },
                        );
                    }
                    _ => {}
                }
            }
        }
    }

    /// The items of a module, inline or in its own file.
    fn module_items(&self, module: &[String]) -> Option<Vec<Item>> {
        let mut items = self.files.get(&Vec::new())?.ast.items.clone();
        for (i, segment) in module.iter().enumerate() {
            let declared = items.iter().find_map(|item| match item {
                Item::Mod(m) if m.ident == segment => Some(m.clone()),
                _ => None,
            })?;
            items = match declared.content {
                Some((_, content)) => content,
                None => self.files.get(&module[..=i])?.ast.items.clone(),
            };
        }
        Some(items)
    }

    /// The public path, from outside burn-backend, of the crate-relative path `path`: modules
    /// that their parent re-exports with a glob (`mod base; pub use base::*;`) are left out;
    /// a private module not so re-exported is an error.
    fn public_path(&self, path: &[String]) -> Result<Vec<String>> {
        let mut out = vec!["burn_backend".to_owned()];
        let Some((last, modules)) = path.split_last() else {
            bail!("empty path");
        };
        let mut items = self
            .module_items(&[])
            .context("burn-backend has no src/lib.rs")?;
        for (i, segment) in modules.iter().enumerate() {
            let declared = items.iter().find_map(|item| match item {
                Item::Mod(m) if m.ident == segment => Some(m.vis.clone()),
                _ => None,
            });
            let Some(vis) = declared else {
                // Not a module declared here (a re-export): kept as written.
                out.extend(path[i..].iter().cloned());
                return Ok(out);
            };
            let glob = items.iter().any(|item| match item {
                Item::Use(u) if matches!(u.vis, Visibility::Public(_)) => {
                    matches!(&u.tree, UseTree::Path(p)
                        if p.ident == segment && matches!(*p.tree, UseTree::Glob(_)))
                }
                _ => false,
            });
            if !glob {
                ensure!(
                    matches!(vis, Visibility::Public(_)),
                    "`crate::{}` is not reachable from outside burn-backend",
                    path.join("::")
                );
                out.push(segment.clone());
            }
            items = self
                .module_items(&modules[..=i])
                .with_context(|| format!("module `crate::{}` not found", modules.join("::")))?;
        }
        out.push(last.clone());
        Ok(out)
    }

    /// Resolves a path written in `file` that starts with `crate`, `super` or `self`.
    fn resolve_relative(&self, file: &SourceFile, path: &[String]) -> Result<Vec<String>> {
        let mut absolute = Vec::new();
        let mut rest = path;
        match path.first().map(String::as_str) {
            Some("crate") => rest = &path[1..],
            Some("self") => {
                absolute.extend(file.module.iter().cloned());
                rest = &path[1..];
            }
            Some("super") => {
                absolute.extend(file.module.iter().cloned());
                while rest.first().is_some_and(|s| s == "super") {
                    ensure!(
                        absolute.pop().is_some(),
                        "`{}` goes above the crate",
                        path.join("::")
                    );
                    rest = &rest[1..];
                }
            }
            _ => bail!("`{}` is not a relative path", path.join("::")),
        }
        absolute.extend(rest.iter().cloned());
        self.public_path(&absolute)
    }

    /// The path from outside burn-backend of a path as written in a `use` item of `file`.
    fn use_path(&self, file: &SourceFile, path: &[String]) -> Result<Vec<String>> {
        match path[0].as_str() {
            "crate" | "self" | "super" => self.resolve_relative(file, path),
            // burn-backend re-exports what backends need of burn_std at the same paths
            // (`pub use burn_std::{..}`, `shape`, `slice`, `quantization`); the compiler checks.
            "burn_std" => Ok(std::iter::once("burn_backend".to_owned())
                .chain(path[1..].iter().cloned())
                .collect()),
            "alloc" => Ok(std::iter::once("std".to_owned())
                .chain(path[1..].iter().cloned())
                .collect()),
            "core" | "std" => Ok(path.to_vec()),
            other => bail!(
                "`{}` comes from the crate `{other}`, which burn-memory does not depend on",
                path.join("::")
            ),
        }
    }

    /// Adds the `use` item that a name written in `file`'s signatures needs.
    fn import(
        &self,
        file: &SourceFile,
        name: &str,
        method: &str,
        imports: &mut Imports,
    ) -> Result<()> {
        let path = if let Some(path) = file.uses.get(name) {
            self.use_path(file, path)?
        } else if file.defined.contains(name) {
            let mut path = file.module.clone();
            path.push(name.to_owned());
            self.public_path(&path)?
        } else if PRELUDE.contains(&name) {
            return Ok(());
        } else {
            bail!(
                "`{method}`: the name `{name}` is not imported by {} (glob imports there: {})",
                file.module.join("/"),
                file.has_glob
            );
        };
        if PRELUDE.contains(&name) && matches!(path[0].as_str(), "std" | "core") {
            return Ok(());
        }
        imports.add(name, path)
    }

    /// The impl of one trait (as text), and the names of its methods.
    fn trait_impl(
        &self,
        file: &SourceFile,
        item: &syn::ItemTrait,
        target: &Target,
        overridden: Option<&BTreeSet<(String, String)>>,
        imports: &mut Imports,
    ) -> Result<(String, Vec<String>, Vec<String>)> {
        let name = &item.ident;
        let param = single_type_param(&item.generics)
            .with_context(|| format!("trait {name} should have one type parameter"))?;
        ensure!(
            item.generics.params.len() == 1,
            "trait {name} should have one generic parameter"
        );
        self.import(file, &name.to_string(), name.to_string().as_str(), imports)?;
        let mut methods = Vec::new();
        let mut names = Vec::new();
        let mut left = Vec::new();
        for trait_item in &item.items {
            match trait_item {
                TraitItem::Fn(f) => {
                    let method = f.sig.ident.to_string();
                    if let (Some(overridden), Body::Forward { via_f32, own, .. }) =
                        (overridden, &target.body)
                        && f.default.is_some()
                        && !overridden.contains(&(name.to_string(), method.clone()))
                        && !via_f32.contains(&method.as_str())
                        && !own.contains(&method.as_str())
                    {
                        left.push(method);
                        continue;
                    }
                    let ctx = MethodCtx {
                        krate: self,
                        file,
                        param: &param,
                        method: f.sig.ident.to_string(),
                        body: &target.body,
                    };
                    methods.push(ctx.method(f, imports)?);
                    names.push(f.sig.ident.to_string());
                }
                other => bail!(
                    "trait {name} has an item that is not a method: {}",
                    other.to_token_stream()
                ),
            }
        }
        // Written as text so that a blank line separates the methods (rustfmt keeps it).
        let methods: Vec<String> = methods.iter().map(ToString::to_string).collect();
        let text = format!(
            "impl{} {name}<Self> for {} {{\n{}\n}}\n",
            target.generics,
            target.implementor,
            methods.join("\n\n")
        );
        Ok((text, names, left))
    }

    /// What a type holds, with `param` the backend's type parameter; an error where it
    /// mentions the backend in a way that cannot be converted between `B` and `Profiled<B>`.
    fn classify(&self, ty: &Type, param: &str, method: &str) -> Result<Value> {
        let unsupported = || {
            anyhow::anyhow!(
                "`{method}`: cannot forward the type `{}`: it mentions the backend `{param}` in a \
                 way the generator does not convert (teach `xtask/backend-ops/src/main.rs` to)",
                ty.to_token_stream()
            )
        };
        match ty {
            Type::Paren(inner) => self.classify(&inner.elem, param, method),
            Type::Group(inner) => self.classify(&inner.elem, param, method),
            Type::Reference(reference) => {
                if let Type::Slice(slice) = &*reference.elem {
                    return match self.classify(&slice.elem, param, method)? {
                        Value::Tensor(kind) => Ok(Value::Many(Container::Slice, kind)),
                        Value::Other => Ok(Value::Other),
                        _ => Err(unsupported()),
                    };
                }
                match self.classify(&reference.elem, param, method)? {
                    Value::Tensor(_) => Ok(Value::TensorRef),
                    Value::Other => Ok(Value::Other),
                    _ => Err(unsupported()),
                }
            }
            Type::Tuple(tuple) => {
                if tuple.elems.is_empty() {
                    return Ok(Value::Unit);
                }
                let items = tuple
                    .elems
                    .iter()
                    .map(|elem| self.classify(elem, param, method))
                    .collect::<Result<Vec<_>>>()?;
                if items
                    .iter()
                    .any(|item| matches!(item, Value::Future | Value::Unit))
                {
                    return Err(unsupported());
                }
                if items.iter().all(|item| matches!(item, Value::Other)) {
                    Ok(Value::Other)
                } else {
                    Ok(Value::Tuple(items))
                }
            }
            Type::ImplTrait(bounds) => {
                for bound in &bounds.bounds {
                    if let TypeParamBound::Trait(bound) = bound {
                        let last = bound.path.segments.last().expect("a path has a segment");
                        if last.ident == "Future" {
                            // The output must be the same type for `B` and `Profiled<B>`.
                            if let PathArguments::AngleBracketed(args) = &last.arguments {
                                for arg in &args.args {
                                    if let GenericArgument::AssocType(assoc) = arg {
                                        let output = self.classify(&assoc.ty, param, method)?;
                                        if output.needs_conversion() {
                                            return Err(unsupported());
                                        }
                                    }
                                }
                            }
                            return Ok(Value::Future);
                        }
                    }
                }
                if mentions(ty.to_token_stream(), param) {
                    Err(unsupported())
                } else {
                    Ok(Value::Other)
                }
            }
            Type::Path(path) => {
                if let Some(assoc) = assoc_of(ty, param) {
                    return Ok(TensorKind::from_assoc(&assoc).map_or(Value::Other, Value::Tensor));
                }
                if path.qself.is_some() {
                    return if mentions(ty.to_token_stream(), param) {
                        Err(unsupported())
                    } else {
                        Ok(Value::Other)
                    };
                }
                let last = path.path.segments.last().expect("a path has a segment");
                let type_args: Vec<&Type> = match &last.arguments {
                    PathArguments::AngleBracketed(args) => args
                        .args
                        .iter()
                        .filter_map(|arg| match arg {
                            GenericArgument::Type(ty) => Some(ty),
                            _ => None,
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                let name = last.ident.to_string();
                let is_param = |ty: &Type| matches!(ty, Type::Path(p) if p.qself.is_none() && p.path.is_ident(param));
                if let [arg] = type_args.as_slice() {
                    if name == "Vec" || name == "Option" {
                        let container = if name == "Vec" {
                            Container::Vec
                        } else {
                            Container::Option
                        };
                        return match self.classify(arg, param, method)? {
                            Value::Tensor(kind) => Ok(Value::Many(container, kind)),
                            Value::Other => Ok(Value::Other),
                            _ => Err(unsupported()),
                        };
                    }
                    if is_param(arg) {
                        if let Some(assoc) = self.aliases.get(&name) {
                            return Ok(
                                TensorKind::from_assoc(assoc).map_or(Value::Other, Value::Tensor)
                            );
                        }
                        if let Some(entry) = self.types.get(&name) {
                            let entry = entry.as_ref().with_context(|| {
                                format!("`{method}`: two types of burn-backend are named {name}")
                            })?;
                            let field = |ty: &Type| {
                                let value = self.classify(ty, &entry.param, method)?;
                                if matches!(value, Value::Future | Value::Unit) {
                                    return Err(unsupported());
                                }
                                Ok(value)
                            };
                            let name = last.ident.clone();
                            return match &entry.shape {
                                TypeShape::Struct(fields) => Ok(Value::Struct {
                                    name,
                                    fields: fields
                                        .iter()
                                        .map(|(ident, ty)| Ok((ident.clone(), field(ty)?)))
                                        .collect::<Result<_>>()?,
                                }),
                                TypeShape::Enum(variants) => Ok(Value::Enum {
                                    name,
                                    variants: variants
                                        .iter()
                                        .map(|(ident, fields)| {
                                            let fields = match fields {
                                                syn::Fields::Named(named) => Fields::Named(
                                                    named
                                                        .named
                                                        .iter()
                                                        .map(|f| {
                                                            let ident =
                                                                f.ident.clone().expect("named");
                                                            Ok((ident, field(&f.ty)?))
                                                        })
                                                        .collect::<Result<_>>()?,
                                                ),
                                                syn::Fields::Unnamed(unnamed) => Fields::Unnamed(
                                                    unnamed
                                                        .unnamed
                                                        .iter()
                                                        .map(|f| field(&f.ty))
                                                        .collect::<Result<_>>()?,
                                                ),
                                                syn::Fields::Unit => Fields::Unit,
                                            };
                                            Ok((ident.clone(), fields))
                                        })
                                        .collect::<Result<_>>()?,
                                }),
                            };
                        }
                    }
                }
                if mentions(ty.to_token_stream(), param) {
                    Err(unsupported())
                } else {
                    Ok(Value::Other)
                }
            }
            _ => {
                if mentions(ty.to_token_stream(), param) {
                    Err(unsupported())
                } else {
                    Ok(Value::Other)
                }
            }
        }
    }
}

impl SourceFile {
    fn new(module: Vec<String>, ast: syn::File) -> Self {
        let mut uses = BTreeMap::new();
        let mut has_glob = false;
        let mut defined = BTreeSet::new();
        for item in &ast.items {
            match item {
                Item::Use(u) => collect_use(&u.tree, &mut Vec::new(), &mut uses, &mut has_glob),
                Item::Struct(i) => {
                    defined.insert(i.ident.to_string());
                }
                Item::Enum(i) => {
                    defined.insert(i.ident.to_string());
                }
                Item::Trait(i) => {
                    defined.insert(i.ident.to_string());
                }
                Item::Type(i) => {
                    defined.insert(i.ident.to_string());
                }
                Item::Fn(i) => {
                    defined.insert(i.sig.ident.to_string());
                }
                Item::Const(i) => {
                    defined.insert(i.ident.to_string());
                }
                _ => {}
            }
        }
        Self {
            module,
            ast,
            uses,
            has_glob,
            defined,
        }
    }
}

/// Registers a struct or enum generic over the backend; a second of the same name makes the
/// name ambiguous.
fn add_type(types: &mut BTreeMap<String, Option<BackendType>>, name: String, entry: BackendType) {
    types
        .entry(name)
        .and_modify(|known| *known = None)
        .or_insert(Some(entry));
}

/// The module path of a file under `src`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut module: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let file = module.pop().expect("a file name");
    let stem = file.strip_suffix(".rs").unwrap_or(&file);
    if !(stem == "mod" || (module.is_empty() && stem == "lib")) {
        module.push(stem.to_owned());
    }
    module
}

fn collect_use(
    tree: &UseTree,
    prefix: &mut Vec<String>,
    uses: &mut BTreeMap<String, Vec<String>>,
    has_glob: &mut bool,
) {
    match tree {
        UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            collect_use(&path.tree, prefix, uses, has_glob);
            prefix.pop();
        }
        UseTree::Name(name) => {
            let mut path = prefix.clone();
            if name.ident == "self" {
                if let Some(last) = path.last().cloned() {
                    uses.insert(last, path);
                }
            } else {
                path.push(name.ident.to_string());
                uses.insert(name.ident.to_string(), path);
            }
        }
        UseTree::Rename(rename) => {
            let mut path = prefix.clone();
            path.push(rename.ident.to_string());
            uses.insert(rename.rename.to_string(), path);
        }
        UseTree::Glob(_) => *has_glob = true,
        UseTree::Group(group) => {
            for tree in &group.items {
                collect_use(tree, prefix, uses, has_glob);
            }
        }
    }
}

/// The single type parameter of an item's generics.
fn single_type_param(generics: &syn::Generics) -> Option<String> {
    let mut types = generics.params.iter().filter_map(|p| match p {
        GenericParam::Type(t) => Some(t.ident.to_string()),
        _ => None,
    });
    let first = types.next()?;
    types.next().is_none().then_some(first)
}

/// `Assoc` where `ty` is `P::Assoc` or `<P as Trait>::Assoc`, with `P` the parameter.
fn assoc_of(ty: &Type, param: &str) -> Option<String> {
    let Type::Path(path) = ty else {
        return None;
    };
    let segments = &path.path.segments;
    match &path.qself {
        Some(qself) => {
            let Type::Path(inner) = &*qself.ty else {
                return None;
            };
            (inner.qself.is_none()
                && inner.path.is_ident(param)
                && segments.len() == qself.position + 1)
                .then(|| segments.last().expect("one").ident.to_string())
        }
        None => (segments.len() == 2
            && segments[0].ident == param
            && segments.iter().all(|s| s.arguments.is_none()))
        .then(|| segments[1].ident.to_string()),
    }
}

/// Whether a token stream names `ident`.
fn mentions(tokens: TokenStream, ident: &str) -> bool {
    tokens.into_iter().any(|tree| match tree {
        TokenTree::Ident(i) => i == ident,
        TokenTree::Group(g) => mentions(g.stream(), ident),
        _ => false,
    })
}

/// The names a signature uses as the first segment of a path.
#[derive(Default)]
struct PathHeads {
    heads: BTreeSet<String>,
}

impl<'ast> Visit<'ast> for PathHeads {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none()
            && let Some(first) = path.segments.first()
        {
            self.heads.insert(first.ident.to_string());
        }
        syn::visit::visit_path(self, path);
    }
}

/// The generation of one method.
struct MethodCtx<'a> {
    krate: &'a Crate,
    file: &'a SourceFile,
    /// The trait's backend parameter (`B`).
    param: &'a str,
    method: String,
    body: &'a Body,
}

/// A parameter of the forwarded method.
struct Param {
    ident: Ident,
    value: Value,
    ty: Type,
}

impl MethodCtx<'_> {
    /// `tokens` with the trait's parameter replaced by `to` and paths relative to the
    /// trait's file (`crate::`, `super::`, `self::`) made absolute.
    fn rewrite(&self, tokens: TokenStream, to: &str) -> Result<TokenStream> {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut out = Vec::with_capacity(trees.len());
        let mut i = 0;
        let is_colons = |i: usize| {
            matches!((trees.get(i), trees.get(i + 1)),
                (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                    if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
        };
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Ident(ident)
                    if (ident == "crate" || ident == "super" || ident == "self")
                        && is_colons(i + 1)
                        && !(i >= 2 && is_colons(i - 2)) =>
                {
                    let mut path = vec![ident.to_string()];
                    let mut j = i + 1;
                    while is_colons(j) {
                        match trees.get(j + 2) {
                            Some(TokenTree::Ident(next)) => {
                                path.push(next.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    let absolute = self
                        .krate
                        .resolve_relative(self.file, &path)
                        .with_context(|| format!("`{}`", self.method))?;
                    let span = ident.span();
                    for (k, segment) in absolute.iter().enumerate() {
                        if k > 0 {
                            out.push(TokenTree::Punct(Punct::new(':', Spacing::Joint)));
                            out.push(TokenTree::Punct(Punct::new(':', Spacing::Alone)));
                        }
                        out.push(TokenTree::Ident(Ident::new(segment, span)));
                    }
                    i = j;
                    continue;
                }
                TokenTree::Ident(ident) if ident == self.param && !(i >= 2 && is_colons(i - 2)) => {
                    out.push(TokenTree::Ident(Ident::new(to, ident.span())));
                }
                TokenTree::Group(group) => {
                    let mut new = Group::new(group.delimiter(), self.rewrite(group.stream(), to)?);
                    new.set_span(group.span());
                    out.push(TokenTree::Group(new));
                }
                other => out.push(other.clone()),
            }
            i += 1;
        }
        Ok(out.into_iter().collect())
    }

    fn method(&self, f: &TraitItemFn, imports: &mut Imports) -> Result<TokenStream> {
        let method = &self.method;
        let mut sig = f.sig.clone();
        ensure!(
            sig.asyncness.is_none() && sig.constness.is_none() && sig.variadic.is_none(),
            "`{method}`: async, const or variadic methods are not supported"
        );
        // Attributes: docs are left out, lint levels kept, anything else refused.
        let mut attrs = Vec::new();
        for attr in &f.attrs {
            if attr.path().is_ident("doc") {
                continue;
            }
            ensure!(
                attr.path().is_ident("allow") || attr.path().is_ident("expect"),
                "`{method}`: attribute `{}` is not supported",
                attr.to_token_stream()
            );
            attrs.push(attr.to_token_stream());
        }
        // Generic parameters of the method itself.
        let mut generic_types = Vec::new();
        for generic in &sig.generics.params {
            match generic {
                GenericParam::Type(t) => {
                    ensure!(
                        t.ident != "B" && t.ident != self.param,
                        "`{method}`: a type parameter named {} would shadow the backend",
                        t.ident
                    );
                    generic_types.push(t.ident.clone());
                }
                GenericParam::Const(c) => generic_types.push(c.ident.clone()),
                GenericParam::Lifetime(_) => {}
            }
        }
        // Names the signature needs imported.
        let mut heads = PathHeads::default();
        heads.visit_signature(&sig);
        for head in &heads.heads {
            let own_generic = generic_types.iter().any(|g| g == head);
            if head == self.param
                || own_generic
                || matches!(head.as_str(), "crate" | "super" | "self")
            {
                continue;
            }
            self.krate.import(self.file, head, method, imports)?;
        }
        // Parameters.
        let mut params = Vec::new();
        for (i, input) in sig.inputs.iter_mut().enumerate() {
            let FnArg::Typed(typed) = input else {
                bail!("`{method}` takes `self`: not supported");
            };
            let ident = match &*typed.pat {
                Pat::Ident(pat) if pat.by_ref.is_none() && pat.subpat.is_none() => {
                    pat.ident.clone()
                }
                _ => format_ident!("arg{i}"),
            };
            typed.attrs.clear();
            *typed.pat = Pat::Verbatim(ident.to_token_stream());
            let value = self.krate.classify(&typed.ty, self.param, method)?;
            ensure!(
                !matches!(value, Value::Future | Value::Unit),
                "`{method}`: parameter {ident} has a type the generator does not forward"
            );
            params.push(Param {
                ident,
                value,
                ty: (*typed.ty).clone(),
            });
        }
        for reserved in ["desc", "descs", "Call"] {
            ensure!(
                params.iter().all(|p| p.ident != reserved),
                "`{method}`: a parameter is named `{reserved}`"
            );
        }
        let fresh = |name: &str| {
            let mut name = name.to_owned();
            while params.iter().any(|p| p.ident == name) {
                name.push('_');
            }
            Ident::new(&name, Span::call_site())
        };
        let call = fresh("call");
        let out = fresh("out");
        let output = match &sig.output {
            ReturnType::Default => Value::Unit,
            ReturnType::Type(_, ty) => self.krate.classify(ty, self.param, method)?,
        };
        // Turbofish, where a type parameter appears in no argument.
        let arg_tokens: TokenStream = params.iter().map(|p| p.ty.to_token_stream()).collect();
        let inferable = generic_types
            .iter()
            .all(|g| mentions(arg_tokens.clone(), &g.to_string()));
        let turbofish = if inferable {
            quote!()
        } else {
            ensure!(
                !params.iter().any(|p| matches!(p.ty, Type::ImplTrait(_))),
                "`{method}`: a type parameter cannot be inferred and the method takes `impl Trait`"
            );
            quote!(::<#(#generic_types),*>)
        };
        if params.len() > 7
            && !attrs
                .iter()
                .any(|attr| attr.to_string().contains("too_many_arguments"))
        {
            attrs.push(quote!(#[allow(clippy::too_many_arguments)]));
        }

        let name = &sig.ident;
        if let Body::Forward { .. } = self.body {
            let body = self.forward_body(&params, &output, &sig, &turbofish)?;
            let sig = self.rewrite(sig.to_token_stream(), "Self")?;
            return Ok(quote! {
                #(#attrs)*
                #sig {
                    #body
                }
            });
        }
        let name_str = name.to_string();
        let inputs = describe_closure(
            &params
                .iter()
                .map(|p| (p.ident.to_token_stream(), &p.value))
                .collect::<Vec<_>>(),
        );
        // Parameters of a struct type are rebuilt for `B`.
        let conversions = self.rebuilt_params(&params, "B")?;
        let args = params.iter().map(|p| &p.ident);
        let fallback_sync = params
            .iter()
            .find(|p| p.ident == "device" && self.is_device_ref(&p.ty))
            .map_or(quote!(Ok(())), |p| {
                let ident = &p.ident;
                quote!(B::sync(#ident))
            });
        let body = match &output {
            Value::Unit => quote! {
                let #call = Call::start(#name_str, #inputs);
                #(#conversions)*
                B::#name #turbofish(#(#args),*);
                if let Some(#call) = #call {
                    #call.finish(Vec::new, || #fallback_sync);
                }
            },
            Value::Future => quote! {
                let #call = Call::start(#name_str, #inputs);
                #(#conversions)*
                let #out = B::#name #turbofish(#(#args),*);
                if let Some(#call) = #call {
                    #call.finish(Vec::new, || Ok(()));
                }
                #out
            },
            value => {
                let out_conversion = self.rebuilt_output(&sig, value, &out)?;
                let outputs = describe_closure(&[(out.to_token_stream(), value)]);
                let sync = sync_expr(value, out.to_token_stream(), false, &fallback_sync)
                    .unwrap_or_else(|| fallback_sync.clone());
                quote! {
                    let #call = Call::start(#name_str, #inputs);
                    #(#conversions)*
                    let #out = B::#name #turbofish(#(#args),*);
                    #out_conversion
                    if let Some(#call) = #call {
                        #call.finish(#outputs, || #sync);
                    }
                    #out
                }
            }
        };
        let sig = self.rewrite(sig.to_token_stream(), "Self")?;
        Ok(quote! {
            #(#attrs)*
            #sig {
                #body
            }
        })
    }

    /// `let p: T<to> = …;` for each parameter whose type holds a struct generic over the
    /// backend, rebuilt for the inner backend `to`.
    fn rebuilt_params(&self, params: &[Param], to: &str) -> Result<Vec<TokenStream>> {
        params
            .iter()
            .filter(|p| p.value.needs_conversion())
            .map(|p| {
                let ident = &p.ident;
                let ty = self.rewrite(p.ty.to_token_stream(), to)?;
                let value = convert(&p.value, ident.to_token_stream());
                Ok(quote!(let #ident: #ty = #value;))
            })
            .collect()
    }

    /// `let out: T<Self> = …;` where the output holds such a struct; nothing otherwise.
    fn rebuilt_output(
        &self,
        sig: &syn::Signature,
        value: &Value,
        out: &Ident,
    ) -> Result<TokenStream> {
        if !value.needs_conversion() {
            return Ok(quote!());
        }
        let ReturnType::Type(_, ty) = &sig.output else {
            unreachable!("a struct is returned");
        };
        let ty = self.rewrite(ty.to_token_stream(), "Self")?;
        let converted = convert(value, out.to_token_stream());
        Ok(quote!(let #out: #ty = #converted;))
    }

    /// The body of a [`Body::Forward`] method.
    fn forward_body(
        &self,
        params: &[Param],
        output: &Value,
        sig: &syn::Signature,
        turbofish: &TokenStream,
    ) -> Result<TokenStream> {
        let Body::Forward {
            to, via_f32, own, ..
        } = self.body
        else {
            unreachable!("called for forwarding targets only");
        };
        let method = &self.method;
        let name = &sig.ident;
        let args: Vec<_> = params.iter().map(|p| &p.ident).collect();
        if own.contains(&method.as_str()) {
            return Ok(quote!(super::#name #turbofish(#(#args),*)));
        }
        let to = Ident::new(to, Span::call_site());
        let conversions = self.rebuilt_params(params, &to.to_string())?;
        let forward = if output.needs_conversion() {
            let out = Ident::new("out", Span::call_site());
            let out_conversion = self.rebuilt_output(sig, output, &out)?;
            quote! {
                #(#conversions)*
                let #out = #to::#name #turbofish(#(#args),*);
                #out_conversion
                #out
            }
        } else {
            quote! {
                #(#conversions)*
                #to::#name #turbofish(#(#args),*)
            }
        };
        if !via_f32.contains(&method.as_str()) {
            return Ok(forward);
        }
        // Half-precision float inputs run as f32; a float output is rounded back.
        ensure!(
            conversions.is_empty(),
            "`{method}` is run via f32 but takes a value that is rebuilt for the inner backend"
        );
        let floats: Vec<_> = params
            .iter()
            .filter(|p| matches!(p.value, Value::Tensor(TensorKind::Float)))
            .map(|p| &p.ident)
            .collect();
        ensure!(
            !floats.is_empty(),
            "`{method}` is run via f32 but takes no float tensor"
        );
        ensure!(
            params.iter().all(|p| matches!(
                p.value,
                Value::Tensor(TensorKind::Float | TensorKind::Int | TensorKind::Bool)
                    | Value::Other
            )),
            "`{method}` is run via f32 but takes a container of tensors or a reference to one"
        );
        let dtype = Ident::new(
            if params.iter().any(|p| p.ident == "dtype") {
                "dtype_"
            } else {
                "dtype"
            },
            Span::call_site(),
        );
        let f32_args = params.iter().map(|p| {
            let ident = &p.ident;
            if matches!(p.value, Value::Tensor(TensorKind::Float)) {
                quote!(super::to_f32(#ident))
            } else {
                quote!(#ident)
            }
        });
        let f32_call = quote!(#to::#name #turbofish(#(#f32_args),*));
        let half_input = quote!(super::half_dtype(&[#(&#floats),*]));
        match output {
            // A float output is rounded back to the inputs' half type.
            Value::Tensor(TensorKind::Float) => Ok(quote! {
                if let Some(#dtype) = #half_input {
                    return super::from_f32(#f32_call, #dtype);
                }
                #forward
            }),
            // An int or bool output (comparisons, indices) is the same in either type.
            Value::Tensor(TensorKind::Int | TensorKind::Bool) => Ok(quote! {
                if #half_input.is_some() {
                    return #f32_call;
                }
                #forward
            }),
            _ => bail!("`{method}` is run via f32 but returns neither one tensor nor a float"),
        }
    }

    /// Whether `ty` is `&Device<B>`.
    fn is_device_ref(&self, ty: &Type) -> bool {
        let Type::Reference(reference) = ty else {
            return false;
        };
        if assoc_of(&reference.elem, self.param).is_some_and(|a| a == "Device") {
            return true;
        }
        let Type::Path(path) = &*reference.elem else {
            return false;
        };
        let last = path.path.segments.last().expect("a path has a segment");
        self.krate
            .aliases
            .get(&last.ident.to_string())
            .is_some_and(|assoc| assoc == "Device")
            && mentions(last.arguments.to_token_stream(), self.param)
    }
}

/// One piece of a description: a tensor, an iterator of them, or a `Vec` of them.
enum Piece {
    One(TokenStream),
    Many(TokenStream),
    Vec(TokenStream),
}

/// The pieces describing `value`, reached by the expression `access` (a reference to the
/// value where `by_ref`, a place otherwise).
fn describe(value: &Value, access: TokenStream, by_ref: bool, pieces: &mut Vec<Piece>) {
    match value {
        Value::Tensor(_) if by_ref => pieces.push(Piece::One(quote!(desc(#access)))),
        Value::Tensor(_) => pieces.push(Piece::One(quote!(desc(&#access)))),
        Value::TensorRef => pieces.push(Piece::One(quote!(desc(#access)))),
        Value::Many(_, _) => pieces.push(Piece::Many(quote!(#access.iter().map(desc)))),
        Value::Tuple(items) => {
            for (i, item) in items.iter().enumerate() {
                let index = syn::Index::from(i);
                describe(item, quote!(#access.#index), false, pieces);
            }
        }
        Value::Struct { fields, .. } => {
            for (field, value) in fields {
                describe(value, quote!(#access.#field), false, pieces);
            }
        }
        Value::Enum { name, variants } => {
            let scrutinee = if by_ref { access } else { quote!(&#access) };
            let arms = variants.iter().map(|(variant, fields)| {
                let (pattern, bindings) = fields.pattern(quote!(#name::#variant));
                let mut inner = Vec::new();
                for (binding, value) in bindings {
                    describe(value, binding.to_token_stream(), true, &mut inner);
                }
                let body = collect_pieces(inner);
                quote!(#pattern => #body,)
            });
            pieces.push(Piece::Vec(quote!(match #scrutinee { #(#arms)* })));
        }
        Value::Future | Value::Unit | Value::Other => {}
    }
}

/// An expression giving the `Vec` of descriptions that `pieces` make.
fn collect_pieces(pieces: Vec<Piece>) -> TokenStream {
    if pieces.is_empty() {
        return quote!(Vec::new());
    }
    if pieces.iter().all(|p| matches!(p, Piece::One(_))) {
        let items = pieces.iter().map(|p| match p {
            Piece::One(t) | Piece::Many(t) | Piece::Vec(t) => t,
        });
        return quote!(vec![#(#items),*]);
    }
    match pieces.as_slice() {
        [Piece::Many(iter)] => return quote!(#iter.collect()),
        [Piece::Vec(vec)] => return vec.clone(),
        _ => {}
    }
    let leading: Vec<_> = pieces
        .iter()
        .map_while(|p| match p {
            Piece::One(t) => Some(t),
            _ => None,
        })
        .collect();
    let mut rest = pieces[leading.len()..].iter();
    let init = if leading.is_empty() {
        match rest.next() {
            Some(Piece::Many(first)) => quote!(let mut descs: Vec<_> = #first.collect();),
            Some(Piece::Vec(first)) => quote!(let mut descs = #first;),
            _ => unreachable!("a piece that is not one is many"),
        }
    } else {
        quote!(let mut descs = vec![#(#leading),*];)
    };
    let steps = rest.map(|p| match p {
        Piece::One(t) => quote!(descs.push(#t);),
        Piece::Many(t) | Piece::Vec(t) => quote!(descs.extend(#t);),
    });
    quote!({
        #init
        #(#steps)*
        descs
    })
}

/// The closure (or function) giving the descriptions of the named values.
fn describe_closure(values: &[(TokenStream, &Value)]) -> TokenStream {
    let mut pieces = Vec::new();
    for (access, value) in values {
        describe(value, access.clone(), false, &mut pieces);
    }
    if pieces.is_empty() {
        return quote!(Vec::new);
    }
    let body = collect_pieces(pieces);
    quote!(|| #body)
}

/// The expression syncing the device of the first tensor of `value`, if it starts with one
/// (`access` is a reference to the value where `by_ref`, a place otherwise); variants of an
/// enum that hold no tensor sync with `fallback`.
fn sync_expr(
    value: &Value,
    access: TokenStream,
    by_ref: bool,
    fallback: &TokenStream,
) -> Option<TokenStream> {
    match value {
        Value::Tensor(kind) => {
            let device = format_ident!("{}", kind.device_method());
            let reference = if by_ref { access } else { quote!(&#access) };
            Some(quote!(B::sync(&B::#device(#reference))))
        }
        Value::Many(container, kind) => {
            let device = format_ident!("{}", kind.device_method());
            let first = match container {
                Container::Option => quote!(#access.as_ref()),
                Container::Vec | Container::Slice => quote!(#access.first()),
            };
            Some(quote!(#first.map_or(Ok(()), |t| B::sync(&B::#device(t)))))
        }
        Value::Tuple(items) => sync_expr(&items[0], quote!(#access.0), false, fallback),
        Value::Struct { fields, .. } => {
            let (field, value) = fields.first()?;
            sync_expr(value, quote!(#access.#field), false, fallback)
        }
        Value::Enum { name, variants } => {
            let scrutinee = if by_ref { access } else { quote!(&#access) };
            let mut any = false;
            let arms: Vec<_> = variants
                .iter()
                .map(|(variant, fields)| {
                    let (pattern, bindings) = fields.pattern(quote!(#name::#variant));
                    let sync = bindings.first().and_then(|(binding, value)| {
                        sync_expr(value, binding.to_token_stream(), true, fallback)
                    });
                    any |= sync.is_some();
                    let sync = sync.unwrap_or_else(|| fallback.clone());
                    quote!(#pattern => #sync,)
                })
                .collect();
            any.then(|| quote!(match #scrutinee { #(#arms)* }))
        }
        Value::TensorRef | Value::Future | Value::Unit | Value::Other => None,
    }
}

/// `access` rebuilt for the other backend: structs field by field and enums variant by
/// variant (the field types are the same, the struct and enum types are not).
fn convert(value: &Value, access: TokenStream) -> TokenStream {
    match value {
        Value::Struct { name, fields } => {
            let fields = fields.iter().map(|(field, value)| {
                let inner = convert(value, quote!(#access.#field));
                quote!(#field: #inner)
            });
            quote!(#name { #(#fields),* })
        }
        Value::Enum { name, variants } => {
            let arms = variants.iter().map(|(variant, fields)| {
                let path = quote!(#name::#variant);
                let (pattern, bindings) = fields.pattern(path.clone());
                let built = match fields {
                    Fields::Named(_) => {
                        let fields = bindings.iter().map(|(binding, value)| {
                            let inner = convert(value, binding.to_token_stream());
                            quote!(#binding: #inner)
                        });
                        quote!(#path { #(#fields),* })
                    }
                    Fields::Unnamed(_) => {
                        let fields = bindings
                            .iter()
                            .map(|(binding, value)| convert(value, binding.to_token_stream()));
                        quote!(#path(#(#fields),*))
                    }
                    Fields::Unit => path,
                };
                quote!(#pattern => #built,)
            });
            quote!(match #access { #(#arms)* })
        }
        Value::Tuple(items) if value.needs_conversion() => {
            let items = items.iter().enumerate().map(|(i, item)| {
                let index = syn::Index::from(i);
                convert(item, quote!(#access.#index))
            });
            quote!((#(#items),*))
        }
        _ => access,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generated() -> Vec<Generated> {
        TARGETS
            .iter()
            .map(|target| generate(&workspace_root(), target).expect("the generator runs"))
            .collect()
    }

    #[test]
    fn generated_forwarding_is_current() {
        for (target, generated) in TARGETS.iter().zip(generated()) {
            let path = workspace_root().join(target.output);
            let committed = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("could not read {}: {e}", path.display()));
            assert!(
                committed == generated.code,
                "{} is not what the generator writes from burn-backend {}: run \
                 `cargo backend-ops` and commit the result",
                target.output,
                generated.version
            );
        }
    }

    #[test]
    fn every_trait_method_is_forwarded() {
        let generated = generated();
        for generated in &generated {
            every_method_emitted(generated);
        }
        // The profiler forwards every method; `HalfFlex` leaves Burn's `linear` (which Flex
        // does not implement) to the default, so that it multiplies on `HalfFlex`.
        assert!(
            generated[0]
                .defaulted
                .iter()
                .all(|(_, left)| left.is_empty())
        );
        let module_left = &generated[1]
            .defaulted
            .iter()
            .find(|(t, _)| t == "ModuleOps");
        assert!(module_left.is_some_and(|(_, left)| left.iter().any(|m| m == "linear")));
    }

    /// Every name the `HalfFlex` lists give is a method of the traits (a renamed Burn
    /// operation would otherwise silently leave the list).
    #[test]
    fn half_flex_lists_name_trait_methods() {
        let generated = generated();
        let declared: BTreeSet<&str> = generated[1]
            .declared
            .iter()
            .flat_map(|(_, names)| names.iter().map(String::as_str))
            .collect();
        let Body::Forward { via_f32, own, .. } = &TARGETS[1].body else {
            panic!("HalfFlex forwards");
        };
        for name in via_f32.iter().chain(own.iter()) {
            assert!(declared.contains(name), "{name} is not a trait method");
        }
        assert!(generated[1].code.contains("super::to_f32(lhs)"));
    }

    fn every_method_emitted(generated: &Generated) {
        let file = syn::parse_file(&generated.code).expect("the generated file parses");
        let mut emitted: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for item in &file.items {
            let Item::Impl(item) = item else {
                continue;
            };
            let Some((_, path, _)) = &item.trait_ else {
                continue;
            };
            let name = path.segments.last().unwrap().ident.to_string();
            let methods = item
                .items
                .iter()
                .filter_map(|item| match item {
                    syn::ImplItem::Fn(f) => Some(f.sig.ident.to_string()),
                    _ => None,
                })
                .collect();
            assert!(
                emitted.insert(name.clone(), methods).is_none(),
                "two impls of {name}"
            );
        }
        assert_eq!(generated.declared.len(), TRAITS.len());
        for (name, declared) in &generated.declared {
            let methods = emitted
                .get(name)
                .unwrap_or_else(|| panic!("no impl of {name}"));
            let left = &generated
                .defaulted
                .iter()
                .find(|(trait_name, _)| trait_name == name)
                .unwrap_or_else(|| panic!("no defaults reported for {name}"))
                .1;
            // Emitted and left to the default: together, every declared method, in order.
            let mut all: Vec<&String> = methods.iter().chain(left).collect();
            let order = |m: &&String| declared.iter().position(|d| d == *m);
            all.sort_by_key(order);
            assert_eq!(
                all,
                declared.iter().collect::<Vec<_>>(),
                "{name}: the methods differ"
            );
            let count = generated
                .counts
                .iter()
                .find(|(trait_name, _)| trait_name == name)
                .map(|(_, count)| *count);
            assert_eq!(count, Some(methods.len()), "{name}: the reported count");
        }
        assert_eq!(emitted.len(), TRAITS.len());
    }
}
