/* The C ABI from a C program (linac/linac.h): an op on host memory against a reference written here,
 * output shapes, the description, and one bad call per mistake, each with its message. Built as C11
 * (no C++ in sight) and run by scripts/test.sh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "linac/linac.h"

static int passed = 0, failed = 0;

static void check(int ok, const char* what) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    fprintf(stderr, "FAILED: %s (last error: %s)\n", what, linac_last_error());
  }
}

/* The call fails with `status` and a message that contains `needle`. */
static void check_error(linac_status got, linac_status status, const char* needle, const char* what) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s: status %d (want %d), message contains '%s'", what, (int)got, (int)status, needle);
  check(got == status && strstr(linac_last_error(), needle) != NULL, buf);
}

enum { B = 1, T = 20, H = 2, K = 8, V = 8 };

static float q[B * T * H * K], k[B * T * H * K], v[B * T * H * V], o[B * T * H * V], state[B * H * K * V];
static const int64_t qk_shape[4] = {B, T, H, K}, v_shape[4] = {B, T, H, V}, s_shape[4] = {B, H, K, V};

static linac_tensor host(float* p, const int64_t* shape) {
  linac_tensor t = {p, LINAC_DEVICE_CPU, 0, 4, LINAC_F32, shape, NULL};
  return t;
}

static linac_status run_linear_attn(linac_tensor kt, const char* options) {
  linac_named_tensor in[3] = {{"q", host(q, qk_shape)}, {"k", kt}, {"v", host(v, v_shape)}};
  linac_named_tensor out[2] = {{"o", host(o, v_shape)}, {"final_state", host(state, s_shape)}};
  return linac_op_run("linear_attn", options, in, 3, out, 2, NULL, NULL);
}

/* o_t = scale sum_{s <= t} (q_t . k_s) v_s and the final state sum_s k_s v_s^T, per head, in double. */
static void reference(double scale, double* ref_o, double* ref_s) {
  for (int h = 0; h < H; ++h) {
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < V; ++j) {
        double acc = 0;
        for (int s = 0; s <= t; ++s) {
          double dot = 0;
          for (int i = 0; i < K; ++i) dot += (double)q[(t * H + h) * K + i] * k[(s * H + h) * K + i];
          acc += dot * v[(s * H + h) * V + j];
        }
        ref_o[(t * H + h) * V + j] = scale * acc;
      }
    for (int i = 0; i < K; ++i)
      for (int j = 0; j < V; ++j) {
        double acc = 0;
        for (int s = 0; s < T; ++s) acc += (double)k[(s * H + h) * K + i] * v[(s * H + h) * V + j];
        ref_s[(h * K + i) * V + j] = acc;
      }
  }
}

int main(void) {
  check(linac_abi_version() == LINAC_ABI_VERSION, "ABI version");
  check(strlen(linac_version()) > 0, "version string");

  unsigned seed = 7;
  for (int i = 0; i < B * T * H * K; ++i) {
    seed = seed * 1103515245u + 12345u, q[i] = (float)((seed >> 16) % 2001) / 1000.0f - 1.0f;
    seed = seed * 1103515245u + 12345u, k[i] = (float)((seed >> 16) % 2001) / 1000.0f - 1.0f;
  }
  for (int i = 0; i < B * T * H * V; ++i) seed = seed * 1103515245u + 12345u, v[i] = (float)((seed >> 16) % 2001) / 1000.0f - 1.0f;

  /* A forward on host memory (the CPU interpreter) against the reference. */
  check(run_linear_attn(host(k, qk_shape), "scale=0.25") == LINAC_OK, "linear_attn on host memory");
  static double ref_o[B * T * H * V], ref_s[B * H * K * V];
  reference(0.25, ref_o, ref_s);
  double err = 0;
  for (int i = 0; i < B * T * H * V; ++i) err = fmax(err, fabs(o[i] - ref_o[i]));
  for (int i = 0; i < B * H * K * V; ++i) err = fmax(err, fabs(state[i] - ref_s[i]) / 10);
  check(err < 1e-4, "linear_attn matches the reference");
  /* The same call again reuses its preparation and gives the same result. */
  float first = o[17];
  memset(o, 0, sizeof o);
  check(run_linear_attn(host(k, qk_shape), "scale=0.25") == LINAC_OK && o[17] == first, "a repeated call");

  /* A prepared call, run on the addresses given in the caller's order (o before final_state, v before q:
   * not the names' order), gives what linac_op_run gave. */
  {
    linac_named_tensor in[3] = {{"v", host(v, v_shape)}, {"q", host(q, qk_shape)}, {"k", host(k, qk_shape)}};
    linac_named_tensor out[2] = {{"o", host(o, v_shape)}, {"final_state", host(state, s_shape)}};
    linac_call* call = NULL;
    check(linac_call_prepare("linear_attn", "scale=0.25", in, 3, out, 2, &call) == LINAC_OK && call != NULL,
          "linac_call_prepare");
    check(linac_call_workspace_bytes(call) == 0, "no GPU scratch on host memory");
    static float o2[B * T * H * V], state2[B * H * K * V];
    void* data[5] = {v, q, k, o2, state2};
    check(linac_call_run(call, data, NULL, NULL, NULL) == LINAC_OK && memcmp(o, o2, sizeof o) == 0 &&
              memcmp(state, state2, sizeof state) == 0,
          "linac_call_run equals linac_op_run");
    data[1] = NULL;
    check_error(linac_call_run(call, data, NULL, NULL, NULL), LINAC_ERROR_INVALID, "input 'q' has no data",
                "a prepared call on a null address");
    check_error(linac_call_run(NULL, data, NULL, NULL, NULL), LINAC_ERROR_INVALID, "null call", "null call");
    linac_call_destroy(call);
    linac_call_destroy(NULL);
    int64_t cu[2] = {0, T};
    static const int64_t cu_shape[1] = {2};
    linac_named_tensor varlen[4] = {{"q", host(q, qk_shape)}, {"k", host(k, qk_shape)}, {"v", host(v, v_shape)},
                                    {"cu_seqlens", {cu, LINAC_DEVICE_CPU, 0, 1, LINAC_I64, cu_shape, NULL}}};
    check_error(linac_call_prepare("linear_attn", "", varlen, 4, out, 1, &call), LINAC_ERROR_INVALID,
                "cannot take cu_seqlens", "a prepared varlen call");
    check(call == NULL, "no call after a failed prepare");
  }

  /* Output shapes. */
  {
    linac_named_tensor in[4] = {{"q", host(NULL, qk_shape)}, {"k", host(NULL, qk_shape)}, {"v", host(NULL, v_shape)},
                                {"do", host(NULL, v_shape)}};
    int32_t ndim = 0, dtype = -1;
    int64_t shape[8];
    check(linac_op_output_shape("linear_attn", "", in, 3, "final_state", &ndim, shape, &dtype) == LINAC_OK &&
              ndim == 4 && shape[0] == B && shape[1] == H && shape[2] == K && shape[3] == V && dtype == LINAC_F32,
          "output shape of final_state");
    check(linac_op_output_shape("linear_attn", "backward=1", in, 4, "dq", &ndim, shape, &dtype) == LINAC_OK &&
              ndim == 4 && shape[3] == K,
          "output shape of dq");
    check_error(linac_op_output_shape("linear_attn", "", in, 3, "dz", &ndim, shape, &dtype), LINAC_ERROR_INVALID,
                "no output 'dz'", "unknown output");
  }

  /* The description. */
  check(strstr(linac_op_describe(NULL), "\"gated_delta_rule\"") != NULL, "describe every op");
  check(strstr(linac_op_describe("gla"), "\"dg\"") != NULL, "describe gla");
  check(strlen(linac_op_describe("nope")) == 0 && strstr(linac_last_error(), "unknown op") != NULL, "describe nope");

  /* One bad call per mistake. */
  {
    linac_named_tensor in[3] = {{"q", host(q, qk_shape)}, {"k", host(k, qk_shape)}, {"v", host(v, v_shape)}};
    linac_named_tensor out[1] = {{"o", host(o, v_shape)}};
    check_error(linac_op_run("linear_atn", "", in, 3, out, 1, NULL, NULL), LINAC_ERROR_INVALID, "unknown op", "op name");
    check_error(linac_op_run("linear_attn", "scale", in, 3, out, 1, NULL, NULL), LINAC_ERROR_INVALID,
                "not key=value", "malformed options");
    check_error(linac_op_run("linear_attn", "backward=2", in, 3, out, 1, NULL, NULL), LINAC_ERROR_INVALID,
                "must be 0 or 1", "flag value");
    check_error(linac_op_run("linear_attn", "l2norm_qk=1", in, 3, out, 1, NULL, NULL), LINAC_ERROR_INVALID,
                "does not take", "an option the op lacks");
    check_error(linac_op_run("linear_attn", "", in, 2, out, 1, NULL, NULL), LINAC_ERROR_INVALID, "missing input 'v'",
                "missing input");
    check_error(linac_op_run("linear_attn", "", in, 3, NULL, 1, NULL, NULL), LINAC_ERROR_INVALID, "outputs is null",
                "null outputs");
  }
  {
    static const int64_t short_shape[4] = {B, T - 1, H, K};
    check_error(run_linear_attn(host(k, short_shape), ""), LINAC_ERROR_INVALID, "k has shape [1, 19, 2, 8]",
                "shape mismatch");
    linac_tensor kt = host(k, qk_shape);
    static const int64_t strides[4] = {T * H * K, 1, T * K, T * H};
    kt.strides = strides;
    check_error(run_linear_attn(kt, ""), LINAC_ERROR_INVALID, "not contiguous", "strides");
    kt = host(NULL, qk_shape);
    check_error(run_linear_attn(kt, ""), LINAC_ERROR_INVALID, "no data", "null data");
    kt = host(k, qk_shape);
    kt.dtype = 42;
    check_error(run_linear_attn(kt, ""), LINAC_ERROR_INVALID, "unknown dtype code 42", "dtype code");
    kt = host(k, qk_shape);
    kt.device_type = 7;
    check_error(run_linear_attn(kt, ""), LINAC_ERROR_INVALID, "device type 7", "device type");
    kt = host(k, qk_shape);
    kt.device_type = LINAC_DEVICE_CUDA;
    check_error(run_linear_attn(kt, ""), LINAC_ERROR_INVALID, "pass every tensor on one device", "device mix");
  }
  {
    linac_named_tensor in[3] = {{"q", host(q, qk_shape)}, {"k", host(k, qk_shape)}, {"v", host(v, v_shape)}};
    linac_named_tensor out[1] = {{"o", host(o, qk_shape)}};
    out[0].tensor.shape = s_shape;
    check_error(linac_op_run("linear_attn", "", in, 3, out, 1, NULL, NULL), LINAC_ERROR_INVALID,
                "output 'o' is f32 [1, 2, 8, 8], but linear_attn writes f32 [1, 20, 2, 8]", "output shape");
  }
  {
    /* Every tensor in CUDA memory on a machine without a GPU: a status of its own. */
    linac_tensor qt = host(q, qk_shape), kt = host(k, qk_shape), vt = host(v, v_shape), ot = host(o, v_shape);
    qt.device_type = kt.device_type = vt.device_type = ot.device_type = LINAC_DEVICE_CUDA;
    linac_named_tensor in[3] = {{"q", qt}, {"k", kt}, {"v", vt}};
    linac_named_tensor out[1] = {{"o", ot}};
    const int gpu = linac_gpu_available();
    linac_status s = linac_op_run("linear_attn", "", in, 3, out, 1, NULL, NULL);
    if (gpu)
      check_error(s, LINAC_ERROR_INVALID, "not a device address", "host memory described as CUDA memory");
    else
      check_error(s, LINAC_ERROR_NO_GPU, "CUDA tensors given, but", "CUDA memory without a GPU");
  }

  /* Loading users' ops: a library that is not there says so (tests/python/torch/test_torch_load.py
   * loads real ones). */
  check_error(linac_load_ops("/nonexistent/libmy_ops.so"), LINAC_ERROR_INVALID, "cannot load /nonexistent/libmy_ops.so",
              "a missing user library");
  check_error(linac_load_ops(NULL), LINAC_ERROR_INVALID, "library path is null", "a null library path");
  check(strlen(linac_loaded_ops()) == 0, "no ops loaded");

  printf("c_abi: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
