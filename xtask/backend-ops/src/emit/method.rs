//! One forwarded method: its signature (the trait's backend parameter made `Self`, paths
//! made absolute), the `use` items it needs, its parameters, and the rebuilding of values
//! whose type is generic over the backend; the body is the target's ([`super::profiled`],
//! [`super::fast_flex`]).

use std::collections::BTreeSet;

use anyhow::{Context, Result, bail, ensure};
use proc_macro2::{Group, Ident, Punct, Spacing, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote};
use syn::visit::Visit;
use syn::{FnArg, GenericParam, Pat, ReturnType, TraitItemFn, Type};

use super::Imports;
use crate::parse::classify::{Fields, Value};
use crate::parse::{Crate, SourceFile, mentions};
use crate::targets::Body;

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
pub struct MethodCtx<'a> {
    pub krate: &'a Crate,
    pub file: &'a SourceFile,
    /// The trait's backend parameter (`B`).
    pub param: &'a str,
    pub method: String,
    pub body: &'a Body,
}

/// A parameter of the forwarded method.
pub struct Param {
    pub ident: Ident,
    pub value: Value,
    pub ty: Type,
}

impl MethodCtx<'_> {
    /// `tokens` with the trait's parameter replaced by `to` and paths relative to the
    /// trait's file (`crate::`, `super::`, `self::`) made absolute.
    pub fn rewrite(&self, tokens: TokenStream, to: &str) -> Result<TokenStream> {
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

    pub fn method(&self, f: &TraitItemFn, imports: &mut Imports) -> Result<TokenStream> {
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

        let body = match self.body {
            Body::Record => self.record_body(&params, &output, &sig, &turbofish)?,
            Body::Forward { .. } => self.forward_body(&params, &output, &sig, &turbofish)?,
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
    pub fn rebuilt_params(&self, params: &[Param], to: &str) -> Result<Vec<TokenStream>> {
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
    pub fn rebuilt_output(
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
