//! The processes of an MPI job (`mpirun`, `srun`): MPI's lifetime in this process ([`Mpi`]) and
//! the all-reduce across processes, bounded in time, that says which ranks never came
//! ([`ProcessGroup`]).
//!
//! MPI's own collectives cannot time out, and with a dead rank they never complete. The group
//! therefore runs MPI's non-blocking all-reduce and polls it until the peer's timeout; before
//! each one, every process tells every other that it arrived (a 16-byte message), so that a
//! process that gives up can name the ranks that never reached the operation.

use std::mem::ManuallyDrop;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::request::{Request, StaticScope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Destination, Source};

use crate::DistributedError;
use crate::sync::lock;

/// MPI in this process, from [`init`](Self::init) until it is dropped (which finalises MPI):
/// hold it in `main` while any run with
/// [`DataParallelConfig::mpi`](crate::DataParallelConfig::mpi) lasts. A process that initialised
/// MPI itself needs none. After a lost process ([`DistributedError::ProcessesLost`]) dropping it
/// does not finalise MPI, which would wait for the lost process: exit instead.
///
/// ```no_run
/// # fn main() -> Result<(), burn_data_parallel::DistributedError> {
/// # use burn::backend::{Autodiff, Flex};
/// use burn_data_parallel::{DataParallel, DataParallelConfig, Mpi};
///
/// // Launched as `mpirun -np 4 ./train`: each process is one rank, with one peer here.
/// let mpi = Mpi::init()?;
/// let config = DataParallelConfig::new().with_mpi(true);
/// let parallel = DataParallel::<Autodiff<Flex>>::new(vec![Default::default()], config)?;
/// assert_eq!(parallel.world_size(), mpi.size() as usize);
/// # Ok(()) }
/// ```
pub struct Mpi {
    universe: ManuallyDrop<Universe>,
}

impl Mpi {
    /// Initialises MPI, asking for full thread support (peers call MPI from threads of their
    /// own).
    ///
    /// # Errors
    /// [`DistributedError::Mpi`] when MPI is initialised already in this process, or when the
    /// library offers less than `Serialized` threading.
    pub fn init() -> Result<Self, DistributedError> {
        let Some((universe, threading)) = mpi::initialize_with_threading(Threading::Multiple)
        else {
            return Err(DistributedError::Mpi(
                "MPI is initialised already in this process (or was finalised)".into(),
            ));
        };
        check_threading(threading)?;
        Ok(Self {
            universe: ManuallyDrop::new(universe),
        })
    }

    /// This process's rank in MPI's world, from 0.
    pub fn rank(&self) -> u32 {
        self.universe.world().rank() as u32
    }

    /// How many processes the job has.
    pub fn size(&self) -> u32 {
        self.universe.world().size() as u32
    }
}

impl Drop for Mpi {
    fn drop(&mut self) {
        if PROCESSES_LOST.load(Ordering::Relaxed) {
            tracing::warn!(
                "a process of the MPI job was lost: MPI is not finalised (it would wait for it)"
            );
            return;
        }
        // SAFETY: dropped once, here.
        unsafe { ManuallyDrop::drop(&mut self.universe) };
    }
}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

fn check_threading(threading: Threading) -> Result<(), DistributedError> {
    match threading {
        Threading::Serialized | Threading::Multiple => Ok(()),
        other => Err(DistributedError::Mpi(format!(
            "the MPI library offers threading level {other:?}: data parallel calls MPI from its \
             peers' threads and needs `Serialized` at least"
        ))),
    }
}

/// This process's rank and the job's size, once MPI is initialised.
///
/// # Errors
/// [`DistributedError::InvalidConfig`] when MPI is not initialised, or at a threading level
/// the peers cannot use.
pub(crate) fn rank_and_size() -> Result<(u32, u32), DistributedError> {
    if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
        return Err(DistributedError::InvalidConfig(
            "`mpi` is set but MPI is not initialised: hold `burn_data_parallel::Mpi::init()` \
             while the run lasts, and launch with `mpirun` or `srun`"
                .into(),
        ));
    }
    check_threading(mpi::environment::threading_support())
        .map_err(|error| DistributedError::InvalidConfig(error.to_string()))?;
    let world = SimpleCommunicator::world();
    Ok((world.rank() as u32, world.size() as u32))
}

/// MPI's world communicator (a handle: not `Send`, so made where it is used).
fn world() -> SimpleCommunicator {
    SimpleCommunicator::world()
}

/// The first tag of the arrival messages: each group has its own (`ARRIVAL + generation %
/// ARRIVAL`), so that a message of another group, earlier or later, waits for that group.
/// MPI guarantees tags up to 32767.
const ARRIVAL: i32 = 1 << 14;

/// Whether an all-reduce of this process gave up on a lost process: MPI must not be finalised
/// then.
static PROCESSES_LOST: AtomicBool = AtomicBool::new(false);

/// Every group of this process, numbered: the same number in every process of a job that runs
/// the same program, so that arrivals from an earlier run are told apart.
static GROUPS: AtomicU64 = AtomicU64::new(0);

/// The processes of the job as one peer of each sees them: the all-reduce across processes,
/// with the bookkeeping that names missing ranks.
pub(crate) struct ProcessGroup {
    rank: usize,
    generation: u64,
    /// The tag of this group's arrival messages.
    tag: i32,
    state: Mutex<State>,
}

struct State {
    /// Operations this group started.
    operations: u64,
    /// The last operation each rank said it reached, in this group.
    arrived: Vec<u64>,
    /// Arrival messages not yet known to be sent.
    sending: Vec<Sending>,
    /// The last operation's send buffer, the next one's receive buffer.
    spare: Vec<f32>,
}

/// An arrival message on its way, and its buffer, which MPI reads until the send completes.
struct Sending {
    /// `None` once completed.
    request: Option<Request<'static, [u64]>>,
    buffer: *mut [u64],
}

/// The ranks that never reached an operation before this process gave up on it.
#[derive(Debug)]
pub(crate) struct Lost {
    /// Empty when every rank arrived but the operation still did not complete.
    pub(crate) ranks: Vec<u32>,
}

impl ProcessGroup {
    /// The group of every process of the job. Communicates nothing: the first all-reduce is
    /// the meeting point.
    pub(crate) fn new() -> Result<Self, DistributedError> {
        let (rank, size) = rank_and_size()?;
        let generation = GROUPS.fetch_add(1, Ordering::Relaxed);
        Ok(Self {
            rank: rank as usize,
            generation,
            tag: ARRIVAL + (generation % ARRIVAL as u64) as i32,
            state: Mutex::new(State {
                operations: 0,
                arrived: vec![0; size as usize],
                sending: Vec::new(),
                spare: Vec::new(),
            }),
        })
    }

    /// The element-wise sum of `values` over every process, waiting at most `timeout`.
    ///
    /// # Errors
    /// [`Lost`] naming the ranks that never reached this operation. The group is spent then:
    /// MPI may still write into the operation's buffers, which stay allocated (leaked).
    pub(crate) fn all_reduce_sum(
        &self,
        values: Vec<f32>,
        timeout: Duration,
    ) -> Result<Vec<f32>, Lost> {
        let start = Instant::now();
        let mut state = lock(&self.state);
        state.operations += 1;
        let operation = state.operations;
        self.announce(&mut state, operation);

        // MPI reads `send` and writes `receive` until the operation completes: neither may be
        // freed or moved before, and both are leaked if it never does. The receive buffer is
        // the last operation's send buffer when the sizes match: memory already touched, where
        // a fresh allocation of each step's size made MPI's all-reduce 3 to 5 times slower
        // here (the first writes into new pages).
        let len = values.len();
        let send = ManuallyDrop::new(values);
        let mut receive = ManuallyDrop::new(match std::mem::take(&mut state.spare) {
            spare if spare.len() == len => spare,
            _ => vec![0.0_f32; len],
        });
        // SAFETY: the slices stay valid until the request completes (the vectors are neither
        // dropped nor moved before, and leaked if it never does), and nothing else touches
        // them meanwhile.
        let mut request = unsafe {
            let send: &'static [f32] = &*(send.as_slice() as *const [f32]);
            let receive: &'static mut [f32] = &mut *(receive.as_mut_slice() as *mut [f32]);
            world().immediate_all_reduce_into(StaticScope, send, receive, SystemOperation::sum())
        };
        let mut polls = 0_u32;
        loop {
            match request.test() {
                Ok(_) => break,
                Err(pending) => request = pending,
            }
            self.receive_arrivals(&mut state.arrived);
            if start.elapsed() > timeout {
                // MPI keeps the request and may still use the buffers: all three are leaked.
                std::mem::forget(request);
                PROCESSES_LOST.store(true, Ordering::Relaxed);
                let ranks = (0..state.arrived.len())
                    .filter(|&rank| rank != self.rank && state.arrived[rank] < operation)
                    .map(|rank| rank as u32)
                    .collect();
                return Err(Lost { ranks });
            }
            polls += 1;
            // MPI progresses a non-blocking collective only inside MPI calls: poll eagerly at
            // first, then back off so that a long wait does not take a core from a rank that
            // still computes (several ranks may share a machine).
            if polls < 2_000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        state.spare = ManuallyDrop::into_inner(send);
        let summed = ManuallyDrop::into_inner(receive);
        self.receive_arrivals(&mut state.arrived);
        state.sending.retain_mut(|sending| !sending.try_complete());
        Ok(summed)
    }

    /// Tells every other rank that this process reached `operation`.
    fn announce(&self, state: &mut State, operation: u64) {
        for rank in 0..state.arrived.len() {
            if rank == self.rank {
                continue;
            }
            let buffer = Box::into_raw(vec![self.generation, operation].into_boxed_slice());
            // SAFETY: the buffer is owned through `buffer` until the send completes.
            let request = world()
                .process_at_rank(rank as i32)
                .immediate_send_with_tag(StaticScope, unsafe { &*buffer }, self.tag);
            state.sending.push(Sending {
                request: Some(request),
                buffer,
            });
        }
    }

    /// Takes in this group's arrival messages that came.
    fn receive_arrivals(&self, arrived: &mut [u64]) {
        while let Some((message, status)) = world()
            .any_process()
            .immediate_matched_probe_with_tag(self.tag)
        {
            let mut content = [0_u64; 2];
            message.matched_receive_into(&mut content[..]);
            let [generation, operation] = content;
            if generation == self.generation {
                let rank = status.source_rank() as usize;
                arrived[rank] = arrived[rank].max(operation);
            }
        }
    }
}

// SAFETY: `buffer` is owned by this value alone (MPI only reads it), so the value may move to
// another thread; MPI is initialised at threading level `Serialized` or above, and a group's
// calls are serialised by its mutex.
unsafe impl Send for Sending {}

impl Sending {
    /// Whether the send completed; its buffer is freed then.
    fn try_complete(&mut self) -> bool {
        let Some(request) = self.request.take() else {
            return true;
        };
        match request.test() {
            Ok(_) => {
                // SAFETY: the send completed, MPI no longer reads the buffer.
                drop(unsafe { Box::from_raw(self.buffer) });
                true
            }
            Err(pending) => {
                self.request = Some(pending);
                false
            }
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        // The messages that came after the last operation: a later group reusing the tag must
        // not read them.
        let mut arrived = std::mem::take(&mut state.arrived);
        self.receive_arrivals(&mut arrived);
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for mut sending in std::mem::take(&mut state.sending) {
            if !sending.try_complete() {
                // A send to a rank that is gone may never complete: MPI keeps its buffer.
                std::mem::forget(sending.request);
            }
        }
    }
}
