//! [`Remat`]: the context that owns one DTR runtime and hands out [`RTensor`]s, and
//! [`RematConfig`]: its budget (bytes or a fraction), policy and cost model.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};
use std::time::Duration;

use candle_core::{DeviceLocation, Tensor, Var};
use remat_dtr::{
    make_policy, BudgetMode, DtrConfig, HostBudget, IterationReport, MemoryUsage, PhysicalBudget,
    Runtime, RuntimeStats, TensorId,
};

use crate::cell::{storage_addr, tensor_bytes, Cell};
use crate::error::{DtrResultExt, Error, Result, Typed};
use crate::swap::{measure_bandwidth, CandleTransfer, SwapShared, TransferFaults};
use crate::tensor::{Handle, RTensor};

/// How an op's recompute cost (the `cost` in the eviction score) is obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CostModel {
    /// Wall-clock time of the op's first computation (what DTR measures). Eviction
    /// decisions then vary slightly from run to run; results never do.
    #[default]
    Measured,
    /// Bytes of the op's output (deterministic decisions: tests, benchmarks).
    OutputBytes,
}

/// The budget of a context.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Budget {
    /// No budget: nothing is ever evicted (plain candle memory behaviour).
    #[default]
    Unbounded,
    /// A budget in bytes.
    Bytes(u64),
    /// A fraction of a reference size in bytes (for example a measured peak).
    Fraction {
        /// The fraction, in `(0, 1]` or more.
        fraction: f64,
        /// The reference in bytes.
        of: u64,
    },
}

impl Budget {
    /// The budget in bytes (`None`: unbounded).
    pub fn bytes(self) -> Option<u64> {
        match self {
            Budget::Unbounded => None,
            Budget::Bytes(b) => Some(b),
            Budget::Fraction { fraction, of } => Some((fraction * of as f64).round() as u64),
        }
    }
}

/// Settings of a [`Remat`] context: plain data with builder methods.
///
/// The DTR settings (`policy`, `budget_mode`, `sampling`, …) are remat-dtr's
/// [`DtrConfig`]; [`RematConfig::from_env`] reads them from `REMAT_DTR_CONF` and also
/// accepts `budget:40%` there, a fraction of the reference given in code
/// ([`RematConfig::with_reference_bytes`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RematConfig {
    /// DTR runtime settings; its `budget` is overridden by [`RematConfig::budget`]
    /// unless that is [`Budget::Unbounded`].
    pub dtr: DtrConfig,
    /// The budget.
    pub budget: Budget,
    /// How op costs are obtained.
    pub cost: CostModel,
    /// Settings of the placement model's caching allocator (physical budgets):
    /// `None` is remat-alloc's default (PyTorch's: 2 MiB small segments, 20 MiB
    /// segments for 1–10 MiB requests).
    pub allocator: Option<remat_alloc::AllocatorConfig>,
    /// Seed of the dropout seeds: the `i`-th [`RTensor::dropout`] call of a context
    /// (from 0) uses `dropout_seed + i · 0x9e3779b97f4a7c15` (wrapping), recorded in
    /// its op so that a replay draws the same mask.
    pub dropout_seed: u64,
    /// Run a convolution layer with a bias as candle-nn composes it: the
    /// convolution, then a broadcast add, two ops whose outputs plain candle's
    /// graph both holds. Off by default: the layer is then one op
    /// ([`RTensor::conv2d_bias`]) and its convolution output never exists
    /// beside the sum. Values and gradients are the same bits either way; the
    /// split form's unconstrained peak is the one to compare with plain candle.
    pub split_layer_ops: bool,
    /// The device whose copies [`Remat::new`] times when swap is on without a
    /// bandwidth (`dtr.swap`; see [`RematConfig::with_swap`]); `None`: the
    /// CPU.
    pub swap_device: Option<DeviceLocation>,
}

impl RematConfig {
    /// Default settings: no budget, remat's default policy, measured costs.
    pub fn new() -> Self {
        Self::default()
    }

    /// A budget in bytes.
    pub fn with_budget_bytes(mut self, bytes: u64) -> Self {
        self.budget = Budget::Bytes(bytes);
        self
    }

    /// A budget as a fraction of `of` bytes.
    pub fn with_budget_fraction(mut self, fraction: f64, of: u64) -> Self {
        self.budget = Budget::Fraction { fraction, of };
        self
    }

    /// Replace the DTR settings.
    pub fn with_dtr(mut self, dtr: DtrConfig) -> Self {
        self.dtr = dtr;
        self
    }

    /// Set the cost model.
    pub fn with_cost_model(mut self, cost: CostModel) -> Self {
        self.cost = cost;
        self
    }

    /// Set the placement model's allocator settings.
    pub fn with_allocator(mut self, config: remat_alloc::AllocatorConfig) -> Self {
        self.allocator = Some(config);
        self
    }

    /// Set the dropout seed.
    pub fn with_dropout_seed(mut self, seed: u64) -> Self {
        self.dropout_seed = seed;
        self
    }

    /// Run layers as candle-nn composes them (see [`RematConfig::split_layer_ops`]).
    pub fn with_split_layer_ops(mut self, split: bool) -> Self {
        self.split_layer_ops = split;
        self
    }

    /// Turn the host tier on (swap, see [`crate::swap`]): the runtime may copy
    /// a storage to host memory and free its device memory when that costs
    /// less than recomputing it, and moves parameters and inputs off the
    /// device between their uses. `bandwidth_gbps` is the copy bandwidth per
    /// direction in GB/s; `None` measures it when the context is created (a
    /// copy of 8 MiB to host memory and back on [`RematConfig::swap_device`],
    /// the fastest of three; [`Remat::swap_bandwidth`] tells the figure).
    ///
    /// Unlike [`DtrConfig::with_swap`], `None` does not turn swap off; swap is
    /// off by default (`dtr.swap.enabled`).
    pub fn with_swap(mut self, bandwidth_gbps: Option<f64>) -> Self {
        self.dtr.swap.enabled = true;
        self.dtr.swap.bandwidth_gbps = bandwidth_gbps;
        self
    }

    /// Limit the host tier to `budget` (bytes, or a percentage of the device
    /// budget); `None`: unbounded. A swap-out that would exceed it is not
    /// made (the storage is evicted instead, or kept if it cannot be).
    pub fn with_host_budget(mut self, budget: Option<HostBudget>) -> Self {
        self.dtr.swap.host_budget = budget;
        self
    }

    /// Measure the swap bandwidth on `device` (see [`RematConfig::with_swap`]).
    pub fn with_swap_device(mut self, device: &candle_core::Device) -> Self {
        self.swap_device = Some(device.location());
        self
    }

    /// Resolve a fraction budget parsed from the environment against `reference`
    /// bytes (see [`RematConfig::parse`]).
    pub fn with_reference_bytes(mut self, reference: u64) -> Self {
        if let Budget::Fraction { fraction, .. } = self.budget {
            self.budget = Budget::Fraction {
                fraction,
                of: reference,
            };
        }
        self
    }

    /// Parse `REMAT_DTR_CONF` syntax. `budget:NN%` (or a bare fraction such as
    /// `budget:0.4`) is a fraction of a reference set later with
    /// [`RematConfig::with_reference_bytes`]; every other key is remat-dtr's,
    /// the host tier's included (`swap:on`, `swap_bandwidth:<GB/s>` — unset,
    /// measured as for [`RematConfig::with_swap`] — and
    /// `host_budget:<bytes|N%|none>`).
    pub fn parse(text: &str) -> Result<Self> {
        let mut fraction = None;
        let mut rest = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if let Some(v) = item.strip_prefix("budget:").map(str::trim) {
                if let Some(p) = v.strip_suffix('%') {
                    fraction = Some(parse_fraction(v, p.trim(), 100.0)?);
                    continue;
                }
                if v.contains('.') && v.chars().all(|c| c.is_ascii_digit() || c == '.') {
                    fraction = Some(parse_fraction(v, v, 1.0)?);
                    continue;
                }
            }
            rest.push(item);
        }
        let dtr = DtrConfig::parse(&rest.join(","))
            .map_err(remat_dtr::Error::from)
            .c()?;
        let budget = match (fraction, dtr.budget) {
            (Some(f), _) => Budget::Fraction { fraction: f, of: 0 },
            (None, Some(b)) => Budget::Bytes(b),
            (None, None) => Budget::Unbounded,
        };
        Ok(Self {
            dtr,
            budget,
            ..Self::default()
        })
    }

    /// Read `REMAT_DTR_CONF` (unset: the defaults).
    pub fn from_env() -> Result<Self> {
        match std::env::var(remat_dtr::config::ENV_VAR) {
            Ok(v) => Self::parse(&v),
            Err(_) => Ok(Self::default()),
        }
    }
}

fn parse_fraction(whole: &str, num: &str, div: f64) -> Typed<f64> {
    match num.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x / div),
        _ => Err(Error::Dtr(remat_dtr::Error::Config(
            remat_dtr::ConfigError::BadValue {
                key: "budget".into(),
                value: whole.into(),
                expected: "bytes, a percentage such as 40%, or a fraction such as 0.4".into(),
            },
        ))),
    }
}

/// Shared state of a context.
pub(crate) struct Inner {
    rt: Mutex<Runtime<Cell>>,
    /// Handles dropped (`false`) or pins dropped (`true`) while the runtime was
    /// busy; applied at the next op.
    pending: Mutex<Vec<(TensorId, bool)>>,
    pub(crate) cost: CostModel,
    /// The typed error of a failed backward step (candle only carries text).
    bwd_error: Mutex<Option<Error>>,
    dropout_seed: AtomicU64,
    budget: Option<u64>,
    /// The eviction threshold of the configuration; calibration never raises
    /// the runtime's above it.
    pub(crate) configured_threshold: Option<u64>,
    /// [`RematConfig::split_layer_ops`].
    pub(crate) split_layer_ops: bool,
    /// External storages by address: the handle and the bytes its record counts.
    /// A storage brought in again (a tied weight wrapped twice) reuses the
    /// handle, so it is counted once. Entries whose handle died are replaced
    /// (the address may have been reused) and pruned as the map grows.
    externals: Mutex<HashMap<usize, (Weak<Handle>, u64)>>,
    /// The op outputs of the current iteration: id, handle, computed from
    /// constants only ([`RTensor::is_constant`]). Read and cleared by
    /// [`Remat::end_iteration`].
    outputs: Mutex<Vec<(TensorId, Weak<Handle>, bool)>>,
    /// External tensors that track gradients (variables), by candle's id:
    /// what an optimizer step updates in place ([`Remat::pin_params`]).
    params: Mutex<Vec<(candle_core::TensorId, Weak<Handle>)>>,
    /// State shared with the host tier's transfer.
    swap: Arc<SwapShared>,
    /// The swap bandwidth in use (GB/s per direction), when swap is on.
    swap_gbps: Option<f64>,
}

impl Inner {
    /// Note an op output of the current iteration (see [`Remat::end_iteration`]).
    pub(crate) fn note_output(&self, id: TensorId, h: Weak<Handle>, constant: bool) -> Typed<()> {
        self.outputs
            .lock()
            .map_err(|_| Error::Poisoned)?
            .push((id, h, constant));
        Ok(())
    }

    /// Lock the runtime after releasing pending handles.
    pub(crate) fn lock(&self) -> Typed<MutexGuard<'_, Runtime<Cell>>> {
        let mut rt = self.rt.lock().map_err(|_| Error::Poisoned)?;
        self.drain(&mut rt)?;
        Ok(rt)
    }

    fn drain(&self, rt: &mut Runtime<Cell>) -> Typed<()> {
        loop {
            let ids = {
                let mut p = self.pending.lock().map_err(|_| Error::Poisoned)?;
                if p.is_empty() {
                    return Ok(());
                }
                std::mem::take(&mut *p)
            };
            for (id, unpin) in ids {
                if unpin {
                    rt.unpin(id)?;
                } else {
                    rt.release(id)?;
                }
            }
        }
    }

    /// Release a handle now if the runtime is free, else at the next op. Never
    /// blocks on the runtime (drops can happen while it is locked on this thread).
    pub(crate) fn release_later(&self, id: TensorId) {
        self.later(id, false);
    }

    /// Undo a pin now if the runtime is free, else at the next op.
    pub(crate) fn unpin_later(&self, id: TensorId) {
        self.later(id, true);
    }

    fn later(&self, id: TensorId, unpin: bool) {
        match self.rt.try_lock() {
            Ok(mut rt) => {
                // An error means an unknown handle or a pin mismatch: a bug that
                // check_invariants would report; nothing to undo here.
                let _ = if unpin { rt.unpin(id) } else { rt.release(id) };
                let _ = self.drain(&mut rt);
            }
            Err(TryLockError::WouldBlock) | Err(TryLockError::Poisoned(_)) => {
                if let Ok(mut p) = self.pending.lock() {
                    p.push((id, unpin));
                }
            }
        }
    }

    /// Keep `e` for [`Inner::take_bwd_error`] and return candle's text form of it.
    pub(crate) fn stash_bwd_error(&self, e: Error) -> candle_core::Error {
        let text = candle_core::Error::Msg(e.to_string());
        if let Ok(mut slot) = self.bwd_error.lock() {
            *slot = Some(e);
        }
        text
    }

    /// The typed error of the last failed backward step, if any.
    pub(crate) fn take_bwd_error(&self) -> Option<Error> {
        self.bwd_error.lock().ok().and_then(|mut s| s.take())
    }

    pub(crate) fn next_dropout_seed(&self) -> u64 {
        self.dropout_seed
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
    }

    pub(crate) fn cost_of(&self, elapsed: Duration, out_bytes: u64) -> u64 {
        match self.cost {
            CostModel::Measured => elapsed.as_nanos().min(u64::MAX as u128) as u64 + 1,
            CostModel::OutputBytes => out_bytes.max(1),
        }
    }
}

/// Parameters kept resident by [`Remat::pin_params`] until the guard drops.
pub struct PinnedParams {
    ctx: Arc<Inner>,
    held: Vec<Arc<Handle>>,
}

impl PinnedParams {
    /// How many runtime storages the guard pins.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether the guard pins nothing (swap off, or no parameter).
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

impl std::fmt::Debug for PinnedParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedParams")
            .field("pinned", &self.held.len())
            .finish()
    }
}

impl Drop for PinnedParams {
    fn drop(&mut self) {
        // Unpins are queued before the handles go (a release after its unpin).
        for h in &self.held {
            self.ctx.unpin_later(h.id());
        }
    }
}

std::thread_local! {
    /// The thread's current context: the one [`RTensor`]'s constructors
    /// (`RTensor::new`, `arange`, `zeros`, …) bring their data into.
    static CURRENT: std::cell::RefCell<Weak<Inner>> = const { std::cell::RefCell::new(Weak::new()) };
}

/// A rematerialization context: one DTR runtime under a budget. Cheap to clone
/// (shared); every [`RTensor`] holds its context.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use remat_candle::{Remat, RematConfig};
/// # fn main() -> remat_candle::Result<()> {
/// let remat = Remat::new(RematConfig::new().with_budget_bytes(64 << 20))?;
/// let t = Tensor::ones((4, 4), candle_core::DType::F32, &Device::Cpu)?;
/// let x = remat.input(&t)?;
/// let y = x.exp()?.sum_all()?;
/// // The same value as plain candle, bit for bit.
/// assert_eq!(y.to_scalar::<f32>()?, t.exp()?.sum_all()?.to_scalar::<f32>()?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Remat {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Remat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remat")
            .field("budget", &self.inner.budget)
            .field("cost", &self.inner.cost)
            .finish_non_exhaustive()
    }
}

impl Remat {
    /// A context for `config`.
    pub fn new(config: RematConfig) -> Result<Self> {
        let mut dtr = config.dtr.clone();
        if let Some(b) = config.budget.bytes() {
            dtr.budget = Some(b);
        }
        if let Budget::Fraction { of: 0, .. } = config.budget {
            return Err(Error::Unsupported {
                op: "Remat::new",
                message: "a fractional budget needs a reference size \
                          (RematConfig::with_reference_bytes)"
                    .into(),
            }
            .into());
        }
        let budget = dtr.budget;
        let configured_threshold = dtr.threshold;
        let swap = Arc::new(SwapShared::default());
        if dtr.swap.enabled && dtr.swap.bandwidth_gbps.is_none() {
            let device = match config.swap_device {
                None | Some(DeviceLocation::Cpu) => candle_core::Device::Cpu,
                Some(DeviceLocation::Cuda { gpu_id }) => candle_core::Device::new_cuda(gpu_id)?,
                Some(DeviceLocation::Metal { .. }) => {
                    return Err(Error::unsupported(
                        "Remat::new",
                        "remat-candle does not support metal",
                    ))
                }
            };
            dtr.swap.bandwidth_gbps = Some(measure_bandwidth(&device)?);
        }
        let swap_gbps = dtr.swap.bandwidth_gbps.filter(|_| dtr.swap.enabled);
        let mut rt = match (&config.allocator, dtr.budget_mode, budget) {
            (Some(alloc), BudgetMode::Physical, Some(b)) => {
                let memory = PhysicalBudget::with_config(b, alloc.clone()).c()?;
                let policy = make_policy(dtr.policy, &dtr);
                Runtime::with_parts(dtr, Box::new(memory), policy)
            }
            _ => Runtime::new(dtr).c()?,
        };
        if swap_gbps.is_some() {
            rt.set_host_transfer(Box::new(CandleTransfer::new(swap.clone())))
                .c()?;
        }
        let remat = Self {
            inner: Arc::new(Inner {
                rt: Mutex::new(rt),
                pending: Mutex::new(Vec::new()),
                cost: config.cost,
                bwd_error: Mutex::new(None),
                dropout_seed: AtomicU64::new(config.dropout_seed),
                budget,
                configured_threshold,
                split_layer_ops: config.split_layer_ops,
                externals: Mutex::new(HashMap::new()),
                outputs: Mutex::new(Vec::new()),
                params: Mutex::new(Vec::new()),
                swap,
                swap_gbps,
            }),
        };
        remat.make_current();
        Ok(remat)
    }

    /// Make this the thread's current context: [`RTensor`]'s constructors
    /// (`RTensor::new`, `from_vec`, `arange`, `zeros`, …, candle's `Tensor`
    /// constructors under the same names) bring their data into it, so model
    /// code that builds constants with them ports unchanged. [`Remat::new`]
    /// makes the new context current; call this to switch back to another.
    pub fn make_current(&self) {
        CURRENT.with(|c| *c.borrow_mut() = Arc::downgrade(&self.inner));
    }

    /// The thread's current context (see [`Remat::make_current`]); an error
    /// when none was created on this thread or it was dropped.
    pub fn current() -> Result<Remat> {
        CURRENT
            .with(|c| c.borrow().upgrade())
            .map(|inner| Remat { inner })
            .ok_or_else(|| {
                Error::unsupported(
                    "Remat::current",
                    "no remat context on this thread: create one with Remat::new \
                     (or make one current with Remat::make_current) before building \
                     RTensors from data",
                )
            })
    }

    /// A context without a budget.
    pub fn unbounded() -> Result<Self> {
        Self::new(RematConfig::default())
    }

    /// A context configured from `REMAT_DTR_CONF`.
    pub fn from_env() -> Result<Self> {
        Self::new(RematConfig::from_env()?)
    }

    /// The budget in bytes (`None`: unbounded).
    pub fn budget(&self) -> Option<u64> {
        self.inner.budget
    }

    /// Bring external data in (a batch, a target): counted in the budget, never
    /// evicted. The tensor is shared, not copied.
    ///
    /// A storage already brought in (and still held) is not counted again: the
    /// same record serves both, as for an output layer tied to an embedding
    /// table, provided the first view covers at least as many bytes.
    pub fn input(&self, t: &Tensor) -> Result<RTensor> {
        self.external(t.contiguous()?)
    }

    fn external(&self, t: Tensor) -> Result<RTensor> {
        let addr = storage_addr(&t);
        let bytes = tensor_bytes(&t);
        let mut map = self.inner.externals.lock().map_err(|_| Error::Poisoned)?;
        if let Some((weak, counted)) = map.get(&addr) {
            if let Some(h) = weak.upgrade() {
                if *counted >= bytes {
                    let r = RTensor::with_handle(t, h);
                    self.note_param(&r)?;
                    return Ok(r);
                }
                // A second runtime record for one storage cell: swapping either
                // would empty the other's data, so neither is swapped.
                self.inner
                    .swap
                    .shared_cells
                    .lock()
                    .map_err(|_| Error::Poisoned)?
                    .insert(addr);
            }
        }
        let mut rt = self.inner.lock()?;
        let id = rt.put(Cell::external(t.detach()), bytes).c()?;
        drop(rt);
        let constant = !t.track_op();
        let r = RTensor::from_parts(t, id, self.inner.clone(), true, constant);
        if map.len() >= 64 {
            map.retain(|_, (w, _)| w.strong_count() > 0);
        }
        map.insert(addr, (r.weak_handle(), bytes));
        drop(map);
        self.note_param(&r)?;
        Ok(r)
    }

    /// Remember an external tensor that tracks gradients (a variable) for
    /// [`Remat::pin_params`].
    fn note_param(&self, r: &RTensor) -> Typed<()> {
        if !r.attached().track_op() {
            return Ok(());
        }
        let mut params = self.inner.params.lock().map_err(|_| Error::Poisoned)?;
        if params.len() >= 64 && params.len().is_power_of_two() {
            params.retain(|(_, w)| w.strong_count() > 0);
        }
        params.push((r.attached().id(), r.weak_handle()));
        Ok(())
    }

    /// Keep every parameter resident while the guard lives: the variables
    /// brought in with [`Remat::param`] or a [`crate::nn::VarBuilder`] (external
    /// tensors that track gradients) whose runtime handle is alive. With swap
    /// on ([`RematConfig::with_swap`]) a parameter may be in the host tier
    /// between its uses, its candle storage empty; code that reads or writes a
    /// `Var` outside remat — candle-nn's optimizers, `VarMap::save` — needs it
    /// resident. [`crate::nn::Optimizer`]'s `step` and `backward_step` pin the
    /// parameters they update themselves; pin them for anything else:
    ///
    /// ```no_run
    /// # fn main() -> remat_candle::Result<()> {
    /// # let remat = remat_candle::Remat::unbounded()?;
    /// # let varmap = candle_nn::VarMap::new();
    /// let params = remat.pin_params()?;
    /// varmap.save("model.safetensors")?;
    /// drop(params);
    /// # Ok(()) }
    /// ```
    ///
    /// The parameters must fit the budget together (beside what else is
    /// pinned): otherwise a typed `ImpossibleBudget`, with nothing pinned.
    /// Without swap the guard pins nothing (parameters are never evicted).
    pub fn pin_params(&self) -> Result<PinnedParams> {
        self.pin_params_where(|_| true)
    }

    /// [`Remat::pin_params`] for the parameters that have a gradient in
    /// `grads`: those an optimizer step updates.
    pub fn pin_params_for(&self, grads: &candle_core::backprop::GradStore) -> Result<PinnedParams> {
        self.pin_params_where(|id| grads.get_id(id).is_some())
    }

    fn pin_params_where(
        &self,
        keep: impl Fn(candle_core::TensorId) -> bool,
    ) -> Result<PinnedParams> {
        let mut guard = PinnedParams {
            ctx: self.inner.clone(),
            held: Vec::new(),
        };
        let mut rt = self.inner.lock()?;
        if !rt.swap_enabled() {
            return Ok(guard);
        }
        let mut handles: Vec<Arc<Handle>> = {
            let mut params = self.inner.params.lock().map_err(|_| Error::Poisoned)?;
            params.retain(|(_, w)| w.strong_count() > 0);
            params
                .iter()
                .filter(|(id, _)| keep(*id))
                .filter_map(|(_, w)| w.upgrade())
                .collect()
        };
        handles.sort_by_key(|h| h.id());
        handles.dedup_by_key(|h| h.id());
        for h in handles {
            if let Err(e) = rt.pin(h.id()) {
                for held in &guard.held {
                    let _ = rt.unpin(held.id());
                }
                guard.held.clear();
                return Err(Error::Dtr(e).into());
            }
            guard.held.push(h);
        }
        Ok(guard)
    }

    /// Whether the host tier is on (see [`RematConfig::with_swap`]).
    pub fn swap_enabled(&self) -> Result<bool> {
        Ok(self.inner.lock()?.swap_enabled())
    }

    /// The swap bandwidth in use, GB/s per direction (configured or measured
    /// when the context was created); `None` when swap is off.
    pub fn swap_bandwidth(&self) -> Option<f64> {
        self.inner.swap_gbps
    }

    /// Make the next `out` swap-outs and the next `ins` swap-ins fail before
    /// copying anything, as a failed device copy would (tests of the failure
    /// paths: a failed swap-out leaves the storage resident, a failed swap-in
    /// is a typed `remat_dtr::Error::Transfer` with the host copy kept).
    #[doc(hidden)]
    pub fn inject_transfer_failures(&self, out: u32, ins: u32) {
        self.inner.swap.faults.set(out, ins);
    }

    /// The injected failures not yet spent (see
    /// [`Remat::inject_transfer_failures`]).
    #[doc(hidden)]
    pub fn transfer_faults(&self) -> &TransferFaults {
        &self.inner.swap.faults
    }

    /// candle's `Tensor::new(array, device)` brought in with [`Remat::input`]: a
    /// constant inside `forward` (a scalar for a mask, a position table).
    pub fn tensor<A: candle_core::NdArray>(
        &self,
        array: A,
        device: &candle_core::Device,
    ) -> Result<RTensor> {
        self.input(&Tensor::new(array, device)?)
    }

    /// candle's `Tensor::arange(start, end, device)` as an input.
    pub fn arange<D: candle_core::WithDType>(
        &self,
        start: D,
        end: D,
        device: &candle_core::Device,
    ) -> Result<RTensor> {
        self.input(&Tensor::arange(start, end, device)?)
    }

    /// candle's `Tensor::zeros(shape, dtype, device)` as an input.
    pub fn zeros<S: Into<candle_core::Shape>>(
        &self,
        shape: S,
        dtype: candle_core::DType,
        device: &candle_core::Device,
    ) -> Result<RTensor> {
        self.input(&Tensor::zeros(shape, dtype, device)?)
    }

    /// candle's `Tensor::ones(shape, dtype, device)` as an input.
    pub fn ones<S: Into<candle_core::Shape>>(
        &self,
        shape: S,
        dtype: candle_core::DType,
        device: &candle_core::Device,
    ) -> Result<RTensor> {
        self.input(&Tensor::ones(shape, dtype, device)?)
    }

    /// A trainable parameter: the variable's tensor, shared (optimizer updates are
    /// seen), counted in the budget, never evicted. Gradients land in candle's
    /// `GradStore` under the variable, so candle-nn optimizers work unchanged.
    /// Like [`Remat::input`], a storage already held is counted once.
    pub fn param(&self, v: &Var) -> Result<RTensor> {
        self.external(v.as_tensor().clone())
    }

    /// End a training step: call it after the optimizer step, once per step.
    ///
    /// - Activations the step left evicted become stale: the optimizer may have
    ///   changed the weights they were computed from, so reading one afterwards
    ///   is a typed error (`remat_dtr::Error::StaleValue`), never a silent
    ///   recompute from updated weights. What the step left resident stays
    ///   readable. Read losses and metrics before calling it.
    /// - Except values computed from constants only ([`RTensor::is_constant`]:
    ///   label conversions, masks, rotary tables built from inputs): recomputing
    ///   them is valid in any iteration, so one the step left evicted and the
    ///   user still holds is restored here (if it fits beside what the user
    ///   holds resident) and stays readable.
    /// - With a budget, the step is recorded; once steps repeat, each follows a
    ///   plan made from the step before (plan-ahead DTR: evictions chosen
    ///   knowing the step's future, every allocation placed in one arena). A
    ///   step that differs (another shape, another branch) runs online and is
    ///   planned again. The report says whether the step followed a plan.
    pub fn end_iteration(&self) -> Result<IterationReport> {
        self.finish_iteration(false)
    }

    /// [`Remat::end_iteration`] for [`crate::nn::Optimizer::backward_step`],
    /// which has run the backward itself: under a budget, it first evicts the
    /// step's activations that only candle's graph still holds (no tensor of
    /// the user's refers to them; candle keeps a graph's inputs private). Only
    /// another backward through this step's graph could read them; kept, they
    /// would stay resident, frozen, for as long as the user holds the loss (a
    /// loop that reads the loss after evaluating a test set holds it through
    /// the evaluation).
    pub(crate) fn end_iteration_after_backward(&self) -> Result<IterationReport> {
        self.finish_iteration(true)
    }

    fn finish_iteration(&self, drop_graph_only: bool) -> Result<IterationReport> {
        let noted = std::mem::take(&mut *self.inner.outputs.lock().map_err(|_| Error::Poisoned)?);
        let mut rt = self.inner.lock()?;
        let held: Vec<(TensorId, Arc<Handle>, bool)> = noted
            .iter()
            .filter_map(|(id, w, c)| w.upgrade().map(|h| (*id, h, *c)))
            .collect();
        if drop_graph_only && self.inner.budget.is_some() {
            // What only candle's graph still holds is read by nothing but
            // another backward through this step's graph (see
            // `end_iteration_after_backward`). A dead id (released since) is an
            // error: skipped.
            for (id, w, _) in &noted {
                if w.strong_count() == 0 {
                    let _ = rt.evict(*id);
                }
            }
        }
        // Values computed from constants only are valid in any iteration: one
        // the step left evicted is restored rather than left stale, while what
        // the user holds resident is pinned (restoring must not evict it). One
        // that does not fit stays evicted, stale as any other.
        let mut pins = Vec::new();
        for (id, _, _) in &held {
            if rt.is_resident(*id).c()? {
                rt.pin(*id).c()?;
                pins.push(*id);
            }
        }
        for (id, _, constant) in &held {
            if *constant && !rt.is_resident(*id).c()? && rt.pin(*id).is_ok() {
                pins.push(*id);
            }
        }
        for id in pins {
            rt.unpin(id).c()?;
        }
        let report = rt.end_iteration().c();
        drop(rt);
        drop(held);
        report
    }

    /// Record every step from the next [`Remat::end_iteration`] on (from now
    /// if nothing has run yet), also without a budget, so that
    /// [`Remat::min_feasible_budget`] can answer for an unbudgeted run. With a
    /// budget, steps are recorded anyway.
    pub fn record_iterations(&self) -> Result<()> {
        self.inner.lock()?.record_iterations();
        Ok(())
    }

    /// The smallest budget (bytes, in this context's budget mode) under which
    /// the last recorded step replays at a cost of at most `max_overhead` times
    /// its first computations (1.0: no recomputation; 2.0: at most as much
    /// again). Answered offline by simulating the recorded step under budgets
    /// found by bisection, with plan-ahead DTR's policies: no trial runs.
    ///
    /// The answer is the lower edge of a range of budgets that meet
    /// `max_overhead`: 1 B below it (512 B in the physical mode) does not.
    /// Feasibility is not monotone in the budget (a plan made for a smaller
    /// budget can be cheaper), so a smaller budget may meet it too; the query
    /// does not search for those. Values a step still holds when it ends
    /// (a variable shadowed in the loop and dropped after `end_iteration`)
    /// count as resident in the next step, so drop them first for the
    /// smallest answer.
    ///
    /// ```no_run
    /// # use remat_candle::Remat;
    /// # fn step(_: &Remat) -> remat_candle::Result<()> { Ok(()) }
    /// # fn main() -> remat_candle::Result<()> {
    /// let remat = Remat::unbounded()?;
    /// remat.record_iterations()?;
    /// step(&remat)?; // forward, backward, optimizer step
    /// remat.end_iteration()?;
    /// let floor = remat.min_feasible_budget(2.0)?;
    /// println!("this step fits in {floor} B with at most 2x compute");
    /// # Ok(()) }
    /// ```
    ///
    /// Errors (typed, see [`crate::Error`]): `max_overhead` not a finite number
    /// ≥ 1, or no step recorded whole yet.
    pub fn min_feasible_budget(&self, max_overhead: f64) -> Result<u64> {
        self.inner.lock()?.min_feasible_budget(max_overhead).c()
    }

    /// Write the last recorded step to `path` as a trace in the DTR paper's
    /// format (remat-dtr's [`Recording::to_trace`](remat_dtr::Recording::to_trace)):
    /// its ops under their names with their measured costs, output sizes,
    /// views (`ALIAS`), releases, and the parameters and inputs as constants.
    /// `remat replay`, `remat plan` and `remat advise` run on the file, and it
    /// can go with a bug report. Returns the trace written (named after the
    /// file, up to its first `-`).
    ///
    /// Record first: without a budget call [`Remat::record_iterations`]
    /// before the steps (with a budget they are recorded anyway), then run a
    /// step and end it ([`Remat::end_iteration`], or an optimizer's
    /// `backward_step`).
    ///
    /// ```no_run
    /// # use remat_candle::Remat;
    /// # fn step(_: &Remat) -> remat_candle::Result<()> { Ok(()) }
    /// # fn main() -> remat_candle::Result<()> {
    /// let remat = Remat::unbounded()?;
    /// remat.record_iterations()?;
    /// step(&remat)?;
    /// remat.end_iteration()?;
    /// remat.export_trace("my-model.log")?; // then: remat advise my-model.log
    /// # Ok(()) }
    /// ```
    ///
    /// Errors (typed, see [`crate::Error`]): no step recorded whole yet
    /// ([`remat_dtr::Error::NotRecorded`], saying what to call), or the file
    /// cannot be written ([`remat_dtr::Error::TraceWrite`], naming it).
    pub fn export_trace(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> Result<remat_dtr::trace::Trace> {
        let path = path.as_ref();
        let name = remat_dtr::trace::Trace::name_of(path);
        let trace = self.inner.lock()?.export_trace(&name).c()?;
        remat_dtr::export::write_trace(&trace, path).c()?;
        Ok(trace)
    }

    /// The budget curve of the last recorded step: how much memory it can
    /// save, and at what cost. The step (as [`Remat::export_trace`] writes
    /// it) is replayed as `spec.iterations` training iterations with
    /// plan-ahead over a grid of budgets from its peak down to its floor, on
    /// `spec.threads` threads (remat-dtr's
    /// [`advise`](remat_dtr::replay::advise::advise); `remat advise` on the
    /// exported file prints the same). The runtime is not held meanwhile.
    ///
    /// Errors (typed): no step recorded whole yet, or a spec out of range
    /// (fewer than 2 points or iterations, `max_overhead` below 1).
    pub fn advise(
        &self,
        spec: &remat_dtr::replay::advise::AdviseSpec,
    ) -> Result<remat_dtr::replay::advise::Advice> {
        let trace = self.inner.lock()?.export_trace("step").c()?;
        remat_dtr::replay::advise::advise(&trace, spec, |_, _| {}).map_err(|e| {
            Error::Unsupported {
                op: "Remat::advise",
                message: e.to_string(),
            }
            .into()
        })
    }

    /// Release handles dropped while the runtime was busy.
    pub fn flush(&self) -> Result<()> {
        drop(self.inner.lock()?);
        Ok(())
    }

    /// The runtime's counters.
    pub fn stats(&self) -> Result<RuntimeStats> {
        Ok(self.inner.lock()?.stats().clone())
    }

    /// The memory model's figures (budget, allocated, reserved, peaks).
    pub fn memory_usage(&self) -> Result<MemoryUsage> {
        Ok(self.inner.lock()?.memory_usage())
    }

    /// Storage records the runtime holds (resident, evicted, kept for replay).
    pub fn storage_count(&self) -> Result<usize> {
        Ok(self.inner.lock()?.storage_count())
    }

    /// Walk the runtime's records and check its invariants.
    pub fn check_invariants(&self) -> Result<()> {
        self.inner.lock()?.check_invariants().c()
    }

    /// Run `f` with the runtime locked (advanced: policies, decision times).
    pub fn with_runtime<R>(&self, f: impl FnOnce(&mut Runtime<Cell>) -> R) -> Result<R> {
        let mut rt = self.inner.lock()?;
        Ok(f(&mut rt))
    }

    /// A human-readable report in the spirit of `torch.cuda.memory_summary()`.
    pub fn memory_summary(&self) -> Result<String> {
        let rt = self.inner.lock()?;
        let u = rt.memory_usage();
        let s = rt.stats();
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let mut out = String::new();
        let line = "|---------------------------------------------------------------|\n";
        out.push_str(line);
        out.push_str("|            remat-candle memory summary                        |\n");
        out.push_str(line);
        let budget = match u.capacity {
            Some(c) => format!("{:.2} MiB", mib(c)),
            None => "unbounded".to_string(),
        };
        let rows: Vec<(&str, String)> = vec![
            (
                "model / policy",
                format!("{} / {}", rt.memory().name(), rt.policy_name()),
            ),
            ("budget", budget),
            (
                "allocated (cur / peak)",
                format!("{:.2} / {:.2} MiB", mib(u.allocated), mib(u.peak_allocated)),
            ),
            (
                "reserved  (cur / peak)",
                format!("{:.2} / {:.2} MiB", mib(u.reserved), mib(u.peak_reserved)),
            ),
            (
                "live tensors (cur / peak)",
                format!(
                    "{:.2} / {:.2} MiB",
                    mib(s.live_bytes),
                    mib(s.peak_live_bytes)
                ),
            ),
            ("storage records", rt.storage_count().to_string()),
            ("eviction candidates", rt.candidate_count().to_string()),
            ("evictions", s.evictions.to_string()),
            ("fake deletes", s.fake_deletes.to_string()),
            ("rematerializations", s.rematerializations.to_string()),
            ("OOM retries", s.oom_retries.to_string()),
            ("device OOM retries", s.device_oom_retries.to_string()),
            (
                "compute / remat cost",
                format!("{:.3} / {:.3} ms", s.compute_ns / 1e6, s.remat_ns / 1e6),
            ),
        ];
        let mut rows = rows;
        if rt.swap_enabled() {
            rows.extend([
                (
                    "swap outs / ins",
                    format!("{} / {}", s.swap_outs, s.swap_ins),
                ),
                (
                    "swapped out / in",
                    format!(
                        "{:.2} / {:.2} MiB",
                        mib(s.swapped_out_bytes),
                        mib(s.swapped_in_bytes)
                    ),
                ),
                (
                    "host tier (cur / peak)",
                    format!(
                        "{:.2} / {:.2} MiB",
                        mib(s.host_bytes),
                        mib(s.peak_host_bytes)
                    ),
                ),
                ("copy stalls", format!("{:.3} ms", s.stall_ns / 1e6)),
            ]);
        }
        for (k, v) in rows {
            out.push_str(&format!("| {k:<27} | {v:>31} |\n"));
        }
        out.push_str(line);
        Ok(out)
    }
}
