//! The body of a `Profiled<B>` method ([`Body::Record`]):
//! `B`'s method, recorded with descriptions of the tensors it reads and writes, and synced on
//! the device of its first output.

use anyhow::Result;
use proc_macro2::{Ident, Span, TokenStream};
use quote::{ToTokens, format_ident, quote};
use syn::Type;

use super::method::{MethodCtx, Param};
use crate::parse::classify::{Container, Value};
use crate::parse::{assoc_of, mentions};
#[cfg(doc)]
use crate::targets::Body;

impl MethodCtx<'_> {
    /// The body of a [`Body::Record`] method: `B`'s method between `Call::start` and
    /// `Call::finish` (burn-profiler's `record` module), given the method's parameters, what
    /// it returns, its signature and the turbofish its call needs.
    pub fn record_body(
        &self,
        params: &[Param],
        output: &Value,
        sig: &syn::Signature,
        turbofish: &TokenStream,
    ) -> Result<TokenStream> {
        let fresh = |name: &str| {
            let mut name = name.to_owned();
            while params.iter().any(|p| p.ident == name) {
                name.push('_');
            }
            Ident::new(&name, Span::call_site())
        };
        let call = fresh("call");
        let out = fresh("out");
        let name = &sig.ident;
        let name_str = name.to_string();
        let inputs = describe_closure(
            &params
                .iter()
                .map(|p| (p.ident.to_token_stream(), &p.value))
                .collect::<Vec<_>>(),
        );
        // Parameters of a struct type are rebuilt for `B`.
        let conversions = self.rebuilt_params(params, "B")?;
        let args = params.iter().map(|p| &p.ident);
        let fallback_sync = params
            .iter()
            .find(|p| p.ident == "device" && self.is_device_ref(&p.ty))
            .map_or(quote!(Ok(())), |p| {
                let ident = &p.ident;
                quote!(B::sync(#ident))
            });
        Ok(match output {
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
                let out_conversion = self.rebuilt_output(sig, value, &out)?;
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
        })
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
