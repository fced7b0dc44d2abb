//! [`SentenceEncoder`]: texts in, sentence embeddings out, pooled as the model's
//! sentence-transformers files say ([`Pooling`]).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn_sketch::SketchBackend;

use crate::{BertEncoder, Pooling, Pretrained, PretrainedError, Tokenizer};

/// An encoder with its tokenizer: embeds texts.
#[derive(Debug)]
pub struct SentenceEncoder<B: Backend> {
    /// The encoder (dense as loaded, or converted).
    pub encoder: BertEncoder<B>,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// How token states become the embedding.
    pub pooling: Pooling,
    device: B::Device,
}

impl<B: Backend> SentenceEncoder<B> {
    /// Pairs an encoder with its tokenizer on `device`, pooling as all-MiniLM-L6-v2 does
    /// (mean, unit length; [`with_pooling`](Self::with_pooling) changes it).
    pub fn new(encoder: BertEncoder<B>, tokenizer: Tokenizer, device: B::Device) -> Self {
        Self {
            encoder,
            tokenizer,
            pooling: Pooling::MEAN_NORMALIZED,
            device,
        }
    }

    /// The same encoder pooling by `pooling`.
    pub fn with_pooling(self, pooling: Pooling) -> Self {
        Self { pooling, ..self }
    }

    /// A loaded directory's encoder, tokenizer and pooling.
    pub fn from_pretrained(model: Pretrained<B>, device: B::Device) -> Self {
        Self::new(model.encoder, model.tokenizer, device).with_pooling(model.pooling)
    }

    /// The device the encoder is on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }
}

impl<B: SketchBackend> SentenceEncoder<B> {
    /// Unit-length embeddings of `texts`, `[texts, hidden]`, in one padded batch.
    pub fn embed<S: AsRef<str>>(&self, texts: &[S]) -> Result<Tensor<B, 2>, PretrainedError> {
        let batch = self.tokenizer.encode(texts)?;
        let input = batch.to_input::<B>(&self.device);
        let hidden = self.encoder.forward(&input);
        Ok(self.pooling.apply(hidden, input.mask_pad))
    }

    /// Embeddings of many texts as rows of `f32`, in batches of `batch_size` texts of similar
    /// length (sorted, so that little is padding), returned in the order given. `progress`
    /// is called with the texts done so far.
    pub fn embed_all<S: AsRef<str>>(
        &self,
        texts: &[S],
        batch_size: usize,
        mut progress: impl FnMut(usize),
    ) -> Result<Vec<Vec<f32>>, PretrainedError> {
        if batch_size == 0 {
            return Err(PretrainedError::Input("batch_size 0".into()));
        }
        let lengths: Vec<usize> = texts.iter().map(|t| t.as_ref().len()).collect();
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| lengths[i]);
        let mut rows = vec![Vec::new(); texts.len()];
        let mut done = 0;
        for chunk in order.chunks(batch_size) {
            let batch: Vec<&str> = chunk.iter().map(|&i| texts[i].as_ref()).collect();
            let embedded = self.embed(&batch)?;
            let width = embedded.dims()[1];
            let values = embedded
                .into_data()
                .convert::<f32>()
                .into_vec::<f32>()
                .map_err(|err| PretrainedError::Input(format!("{err:?}")))?;
            for (row, &i) in values.chunks(width).zip(chunk) {
                rows[i] = row.to_vec();
            }
            done += chunk.len();
            progress(done);
        }
        Ok(rows)
    }
}
