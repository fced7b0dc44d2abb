//! The body of a `FastFlex` method ([`Body::Forward`]): Flex's method, run on `f32` copies of
//! half-precision float tensors for the methods listed to run via `f32`.

use anyhow::{Result, bail, ensure};
use proc_macro2::{Ident, Span, TokenStream};
use quote::quote;

use super::method::{MethodCtx, Param};
use crate::parse::classify::{TensorKind, Value};
use crate::targets::Body;

impl MethodCtx<'_> {
    /// The body of a [`Body::Forward`] method.
    pub fn forward_body(
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
}
