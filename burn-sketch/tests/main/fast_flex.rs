//! `SkLinear` on burn-fast-cpu's `FastFlex`: the backend-generic checks (its sketched product is
//! Flex's own path; the backend's operations are tested in burn-fast-cpu).

use burn::backend::Autodiff;
use burn::backend::flex::FlexDevice;
use burn_fast_cpu::FastFlex;
use burn_sketch::backend::KernelStrategy;

type B = FastFlex;
type AB = Autodiff<FastFlex>;
const DEVICE: FlexDevice = FlexDevice;
const STRATEGY: KernelStrategy = KernelStrategy::Autotune;

backend_suite!(B, AB, DEVICE, STRATEGY);
