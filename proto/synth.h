/*
 * A synthetic but realistic stream of policy versions for delta work.
 *
 * The model is shaped like a Llama-style decoder sized to a byte target
 * (hidden d, GQA k/v of d/4, SwiGLU MLP of ~8d/3, vocabulary up to 32000):
 * model.embed_tokens.weight, per layer model.layers.L.{input_layernorm,
 * self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}
 * .weight, model.norm.weight and a frozen lm_head.weight.
 *
 * FP32 masters start as N(0, 0.02) projections and embeddings, norms at
 * 1 + N(0, 0.05). Each step is Adam (beta1 0.9, beta2 0.999, eps 1e-8, no
 * weight decay) on gradients g = s * r_row * (rho * mu + sqrt(1 - rho^2) * e):
 * mu is a persistent per-weight direction, e fresh noise each step, r_row a
 * log-normal per-row scale, rho = 0.5. The optimizer starts in its steady
 * state (moments initialised to their stationary distribution, bias
 * corrections ~1) so that step 1 already looks like step 1000. An embedding
 * row gets a gradient only when its token is seen in the step's batch
 * (2^16 Zipf-distributed tokens over the vocabulary); unseen rows still move
 * with their decaying momentum, as Adam does. lm_head gets no gradient.
 * Every version is exported as BF16, round to nearest even.
 *
 * Randomness is a counter-based hash of (seed, tensor, element, step), so
 * the output depends only on the options, not on the thread count. Normals
 * are Irwin-Hall sums of uniforms (exact mean and variance, tails cut at
 * 3.5 sigma for noise, 4.9 sigma for initial weights): cheap and
 * vectorisable, which is what lets two cores produce 1 GiB per version in
 * seconds. State is generated in slices, so memory stays at a few MiB per
 * thread whatever the model size.
 */
#ifndef PROTO_SYNTH_H
#define PROTO_SYNTH_H

#include <stdint.h>

#include "proto/spec.h"
#include "proto/util.h"

struct proto_synth_opts {
	uint64_t bytes;   /* target size of one BF16 version */
	uint32_t steps;   /* versions v1..v<steps> after v0 */
	double lr;        /* Adam learning rate, e.g. 1e-6 */
	uint64_t seed;
	unsigned threads; /* worker threads, >= 1 */
	int progress;     /* print progress to stderr */
};

/* The Llama-style model spec sized to about `bytes` of BF16 (at least one
 * layer of hidden size 64). On failure *m is empty. */
int proto_synth_model(uint64_t bytes, struct proto_model *m, struct proto_err *err);

/*
 * Writes dir/v0.safetensors .. dir/v<steps>.safetensors (each written to a
 * temporary name and renamed once complete). changed, if not NULL, receives
 * steps + 1 entries: changed[k] is the number of BF16 elements whose bits
 * differ between v(k-1) and vk (changed[0] = 0); *nelem the element count
 * of one version. On failure no vK.safetensors is left half-written.
 */
int proto_synth_run(const char *dir, const struct proto_synth_opts *o,
		    uint64_t *changed, uint64_t *nelem, struct proto_err *err);

#endif
