/* model_shard: the ZeRO stage 3 weight store (docs/engine.md "ZeRO").
 *
 * A sharded model keeps, on each of the job's w ranks, only its partition
 * of the fp32 parameters, of their gradient accumulation (and the trainer
 * keeps only that partition's AdamW moments). The partition is cut per
 * group so that one group is one all-gather:
 *  - group l < L is block l's tensors, group L ("the ends") every tensor
 *    outside the blocks (embeddings, final norm, LM head);
 *  - a group's tensors, in layout order, packed one after the other, are
 *    the group's vector of n_g floats (a tensor-major layout such as
 *    GPT-2's has a block's tensors apart in the buffer: packing makes them
 *    one range);
 *  - rank r holds [kern_shard_lo(n_g, r, w), kern_shard_lo(n_g, r + 1, w))
 *    of each group's vector: the collectives' shards, so the all-gather of
 *    a group and the reduce-scatter of its gradients need no copies.
 *    The rank's partition is those slices, group after group (blocks 0..L-1,
 *    then the ends): m->params [pn], m->grads [pn0 + the caller's tail],
 *    pn0 rank 0's partition (the largest): the tail starts at the same
 *    offset on every rank, as the collectives' spans need.
 *
 * bf16 working weights (model_config.weights_bf16: precision bf16 at
 * stage 3). A block's vector is then two parts, each cut into the ranks'
 * slices on its own: its 2-D tensors (the linear layers' matrices, in
 * every family only ever matmul operands, blocks.h) and the rest (norms,
 * biases: 1-D), each in layout order; the rank's partition holds, per
 * block, its slice of the matrices then its slice of the rest, all fp32:
 * the partition is the master (but see "bf16 partition" below). What a gather makes is the working copy:
 * the matrices in bf16 (the rank's slice narrowed, rounded to nearest
 * even, then a 16-bit all-gather, kern_comm_allgather16), the rest fp32.
 * model_weight widens a matrix into one fp32 fetch scratch (the largest
 * block matrix) right before its op, valid until the next matrix's fetch
 * (the families use one at a time); 1-D tensors resolve into the slot's
 * fp32 part. The device's bf16 precision rounds every matmul operand to
 * bf16 anyway and that rounding is idempotent, so round(widen(narrow(w)))
 * is round(w): the products, hence every bit of the run, are stage 0's.
 * The ends (embeddings, final norm, head, tied or not) stay fp32 (the
 * embedding lookup reads unrounded values); gradients are fp32, a gradient
 * slot holds a block's matrices' part then its rest, as the partition
 * packs them. Without the flag a group is one fp32 vector, as always.
 *
 * bf16 partition (model_config.partition_bf16: weights_bf16 with the
 * optimizer offloaded, not the parameters). The fp32 master of the rank's
 * partition is then the optimizer's, in host memory, handed over with
 * model_shard_set_master; on the device the rank's slices of the blocks'
 * matrices are stored in bf16 (hpart, pn_b16 values, one allocation) and
 * the rest in fp32 (m->params, pn - pn_b16 floats, in partition order with
 * the matrices' slices left out); partition offsets (the gradients, the
 * layout AdamW walks, the master) are unchanged. A gather copies the bf16
 * slice into the slot as it is: narrow(master), what the fp32 partition's
 * gather narrows, so no bit changes. Writes: model_shard_copy's uploads go
 * to the master and to the device (a matrix piece narrowed on the device
 * through the gradient slot); the optimizer's copy-back after a host step
 * is model_shard_store_range (narrowed on the host, 2 bytes a value up).
 * Reads of the whole model (model_shard_snapshot) gather from the master.
 * Not with offload_param: there the host partition is the master itself.
 *
 * Gathers. Before block l's forward and again before its backward
 * (model_layer_begin) the block's vector is all-gathered (per part, with
 * bf16 working weights) into one of two parameter slots, and the next block's (l + 1 forward, l - 1 backward)
 * into the other: a prefetch. kern_comm_allgather is synchronous on every
 * backend (CPU: shared memory; NCCL: queued on the communication stream,
 * then the host waits for it), so the prefetch is only the call order:
 * nothing overlaps yet. An asynchronous gather start (as
 * kern_comm_reduce_start is for the buckets) is where it would. model_layer_end
 * releases the block's slot. The ends are gathered once at the start of
 * each forward (model_shard_pass_begin) and stay in their slot until the
 * next forward: the embedding, the final norm and the (tied) head are used
 * at both ends of a micro-step. Every rank makes the same calls, so every
 * rank's forward and backward must run alike (the trainer's eval runs the
 * same number of forwards on every rank).
 *
 * Gradients. A block's backward writes its gradients into the gradient
 * slot (zeroed at model_layer_begin(l, backward)); model_layer_end
 * reduce-scatters the slot and ADDS the rank's slice into its partition
 * of the gradients, so the micro-steps accumulate there in fp32. The ends'
 * gradients (the head's may be written in a lean forward) go to their own
 * slot, zeroed at each forward with want_grad, reduce-scattered when the
 * backward is done (before the caller's done(-1)). No rank ever holds the
 * whole model's parameters or gradients on the device.
 *
 * Exactness. The collectives sum in rank order (kern_comm.h), so with one
 * micro-step per rank (a = 1) the partition holds the bits stage 0's
 * all-reduce gives; with a > 1 the ranks' sums are added per micro-step
 * (stage 0 adds a rank's micro-steps first), which differs in the order
 * of the fp32 sums only.
 *
 * Device bytes (model_shard_state_bytes, exact): params pn + 2 parameter
 * slots of the largest block + the ends' slot; gradients pn0 + tail + one
 * gradient slot of the largest block + the ends' gradient slot (all fp32).
 * With bf16 working weights a parameter slot is the largest block's 1-D
 * tensors in fp32 and its matrices in bf16 (one allocation each slot), plus
 * one fp32 fetch scratch of the largest block matrix: 4 fewer bytes per
 * block matrix value less 4 per fetch value (LLaMA-2-7B: 600 MiB less).
 * A bf16 partition stores its pn_b16 matrix values at 2 bytes instead of 4
 * (LLaMA-2-7B over 4 ranks: 3.02 GiB less per rank).
 *
 * offload_param (model_shard_create_host): params and the gradient
 * partition (pn each) and one slice's staging (the largest slice of a
 * part, floats) in host memory; a gather uploads the rank's slice into the
 * slot -- a bf16 part's narrowed on the host (kern_bf16_round's bits) into
 * the staging first, so 2 bytes a value cross the bus -- a reduce-scatter's
 * slice is downloaded and added on the host; the device keeps the slots,
 * the fetch scratch and the caller's tail (m->grads, m->gtail == m->grads).
 *
 * Host gradients alone (model_config.grads_host: offload_optimizer without
 * offload_param; model_shard_create_host_grads): the gradient partition
 * and the staging in host memory as above, the parameter partition on the
 * device (fp32, or a bf16 partition). Each block's reduced slice goes to
 * the host at its model_layer_end, synchronously, and is added there; the
 * optimizer steps from that partition itself. model_shard_params_on_host
 * and model_shard_grads_on_host tell the two apart. Partition-ordered
 * vectors that are not the store's (the moments for checkpoints:
 * model_shard_gather_host, model_shard_scatter_host) are in host memory
 * whenever the gradients are: there is no device partition to stage them.
 * Device bytes: model_shard_state_bytes less 4 pn0 (the planner subtracts
 * it, mem_plan.c).
 *
 * Host copies. model_weights_upload writes the rank's pieces of any range
 * (no collective: every rank uploads the same host values). Host reads of
 * the whole model on one rank (a checkpoint, the test hooks) come after
 * model_params_gather (model.h), a collective that leaves the full
 * parameters in host memory on the ranks that keep them.
 *
 * Not supported with a sharded store (the spec refuses them): LoRA, a
 * 16-bit or 4-bit frozen base (the weight store's narrow tensors).
 */
#ifndef ACC_MODEL_SHARD_H
#define ACC_MODEL_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "kern_comm.h"
#include "model.h"

typedef struct model_shard model_shard;

/* The partition of rank `rank` of `world` for cfg: floats it holds (pn),
 * the largest block's floats (slot: a gradient slot) and the ends' (ends);
 * slice: the largest of the rank's slices of one part of a group (a
 * block's bf16 matrices or its fp32 rest; the ends; without weights_bf16 a
 * group is one part). */
typedef struct model_shard_sizes {
    size_t pn, slot, ends;
    size_t slice;
    /* of pn, the values stored in bf16 (partition_bf16: the rank's slices
     * of the blocks' matrices; 0 otherwise) */
    size_t pn_b16;
    /* a parameter slot: its fp32 floats and its bf16 values (weights_bf16:
     * the largest block's 1-D tensors and its matrices; otherwise slot and
     * 0), and the fetch scratch's floats (the largest block matrix; 0
     * without weights_bf16) */
    size_t slot_f32, slot_b16, fetch;
} model_shard_sizes;
int model_shard_sizes_of(const model_config *cfg, int rank, int world, model_shard_sizes *out,
                         acc_err *err);

/* Bytes of one parameter slot (its fp32 and its bf16 part). */
uint64_t model_shard_pslot_bytes(const model_shard_sizes *s);

/* Device bytes of a sharded model's parameters (partition + slots) and of
 * its gradients (partition + grad_tail + slots); overflow-checked. */
int model_shard_state_bytes(const model_config *cfg, size_t grad_tail, int rank, int world,
                            uint64_t *weights, uint64_t *grads, acc_err *err);

/* Build the partition of m (layout built, m->grad_tail set) and allocate
 * params, grads and the slots through the device's budget (zeroed). */
int model_shard_create(model *m, kern_comm *c, int rank, int world, acc_err *err);
void model_shard_free(model *m);
/* offload_param: the same with the partition's parameters (m->params),
 * its gradients (model_shard_host_grads) and a staging slice in host
 * memory through `host`; m->grads is then the caller's tail alone, on the
 * device. A gather uploads the rank's slice into the slot, a reduce-
 * scatter's slice is downloaded and added on the host (fp32, the device
 * add's bits). */
/* With `pin`, the buffers that cross the bus (the parameters, the
 * staging) are page-locked through the device's host_register where it
 * has one (CUDA; CPU devices: nothing to do); a refusal is ACC_EDEVICE
 * naming zero_optimization.offload_param.pin_memory. */
int model_shard_create_host(model *m, kern_comm *c, int rank, int world, struct host_mem *host, bool pin,
                            acc_err *err);
/* model_config.grads_host (offload_optimizer without offload_param): the
 * gradient partition and the staging in host memory through `host`, the
 * parameters on the device; m->grads is the tail alone, as above; `pin`
 * page-locks the staging (zero_optimization.offload_optimizer.pin_memory). */
int model_shard_create_host_grads(model *m, kern_comm *c, int rank, int world, struct host_mem *host, bool pin,
                                  acc_err *err);
bool model_shard_params_on_host(const model *m); /* offload_param */
bool model_shard_grads_on_host(const model *m);  /* offload_param or grads_host */
float *model_shard_host_grads(model *m);          /* NULL unless on the host */
void model_shard_zero_host_grads(model *m);
/* Sum of squares of host gradients [lo, hi), the CPU device's bits. */
double model_shard_host_sumsq(const model *m, size_t lo, size_t hi);
/* A device buffer free between passes (the gradient slot) and its floats. */
float *model_shard_device_scratch(model *m, size_t *n);

/* The weights / gradient slot of the tensor starting at layout offset off
 * (its group gathered); a bf16 block matrix widened into the fetch scratch,
 * valid until the next one's. */
const float *model_shard_weight(model *m, size_t off);
float *model_shard_grad(model *m, size_t off);

void model_shard_layer_begin(model *m, int layer, bool backward);
void model_shard_layer_end(model *m, int layer, bool backward);
/* A forward starts: the ends gathered; with want_grad their gradient slot zeroed. */
void model_shard_pass_begin(model *m, bool want_grad);
/* The backward is done: the ends' gradients reduce-scattered into the partition. */
void model_shard_backward_done(model *m);

/* Host floats [off, off + n) of the layout: uploaded into the rank's
 * pieces (up), or downloaded from the gathered host copy (down; zeros
 * without one). */
void model_shard_copy(model *m, float *down, const float *up, size_t off, size_t n);

/* Collective: part [pn] (a partition-ordered vector: moments; in host
 * memory where the gradient partition is, model_shard_grads_on_host, else
 * on the device) gathered group by group, in fp32 whatever the working weights,
 * through free slots (with bf16 working weights the gradient slot) into
 * host[nparams] in layout order; host NULL: this rank only helps. */
int model_shard_gather_host(model *m, const float *part, float *host);
/* The rank's pieces of the layout-ordered host vector into part [pn]
 * (in host memory where the gradient partition is, else on the device). */
void model_shard_scatter_host(model *m, const float *host, float *part);

/* Collective (every rank): the full parameters gathered (with a bf16
 * partition, from the master: ACC_EINTERNAL without one); ranks with
 * `keep` hold them in host memory for model_shard_copy's reads until
 * model_shard_release. */
int model_shard_snapshot(model *m, bool keep);
void model_shard_release(model *m);

/* bf16 partition (model_config.partition_bf16, on the device): whether
 * this store keeps one; the caller's fp32 master of the partition
 * (host[pn], partition order), set before any weight is written, which
 * model_shard_copy's uploads then write too and the snapshot gathers from;
 * and the store's update from fp32 host values src[hi - lo] of partition
 * range [lo, hi) (the master's after a step): the bf16 part narrowed on
 * the host into `stage` (hi - lo values; NULL: on the device through the
 * gradient slot, between passes), the rest uploaded. Without a bf16
 * partition the store is m->params itself and these are not needed. */
bool model_shard_bf16_partition(const model *m);
void model_shard_set_master(model *m, float *master);
void model_shard_store_range(model *m, const float *src, size_t lo, size_t hi, uint16_t *stage);

/* The partition as a layout (partition offsets, each piece keeping its
 * tensor's name and flags): what AdamW walks. */
const model_layout *model_shard_layout(const model *m);
/* Block gathers so far (tests: once per block per pass). */
uint64_t model_shard_gathers(const model *m);
/* The first collective failure (0: none). */
int model_shard_error(const model *m);

#endif
