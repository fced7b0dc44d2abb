//! What a parameter or return type of a trait method holds ([`Value`]): tensors to record
//! or convert, structs and enums generic over the backend to rebuild for the other backend.

use anyhow::{Context, Result};
use proc_macro2::{Ident, TokenStream};
use quote::{ToTokens, format_ident, quote};
use syn::{GenericArgument, PathArguments, Type, TypeParamBound};

use super::{Crate, TypeShape, assoc_of, mentions};

/// The four tensor primitives of a backend, by the associated type that names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
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
    pub fn device_method(self) -> &'static str {
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
pub enum Container {
    Vec,
    Slice,
    Option,
}

/// What a parameter or return type holds, as far as recording and conversion are concerned.
#[derive(Debug, Clone)]
pub enum Value {
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
pub enum Fields {
    Named(Vec<(Ident, Value)>),
    Unnamed(Vec<Value>),
    Unit,
}

impl Fields {
    /// The variant's pattern binding every field (`V(f0, f1)`, `V { a, b }`, `V`), and the
    /// bindings with their values.
    pub fn pattern(&self, path: TokenStream) -> (TokenStream, Vec<(Ident, &Value)>) {
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
    pub fn needs_conversion(&self) -> bool {
        match self {
            Value::Struct { .. } | Value::Enum { .. } => true,
            Value::Tuple(items) => items.iter().any(Value::needs_conversion),
            _ => false,
        }
    }
}

impl Crate {
    /// What a type holds, with `param` the backend's type parameter; an error where it
    /// mentions the backend in a way that cannot be converted between `B` and `Profiled<B>`.
    pub fn classify(&self, ty: &Type, param: &str, method: &str) -> Result<Value> {
        let unsupported = || {
            anyhow::anyhow!(
                "`{method}`: cannot forward the type `{}`: it mentions the backend `{param}` in a \
                 way the generator does not convert (teach \
                 `xtask/backend-ops/src/parse/classify.rs` to)",
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
