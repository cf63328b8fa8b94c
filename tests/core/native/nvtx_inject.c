/* Test-only NVTX injection library: loaded by NVTX through NVTX_INJECTION64_PATH, it fills the
 * CORE2 (domain) callbacks and appends one line per call to $MAXINSTR_TEST_NVTX_LOG:
 *   domain <name>
 *   register <name>
 *   push <tid> <domain> <message> <payload-type> <payload>
 *   pop <tid> <domain>
 *   mark <tid> <domain> <message> <payload-type> <payload>
 * The NVTX ABI used here (export table, callback ids, nvtxEventAttributes_v2) is declared by hand
 * from the NVTX3 specification, so the test needs no NVTX headers and checks the ABI independently. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef void (*NvtxFunctionPointer)(void);
typedef NvtxFunctionPointer** NvtxFunctionTable;
typedef struct {
  size_t struct_size;
  int (*GetModuleFunctionTable)(int module, NvtxFunctionTable* out_table, unsigned int* out_size);
} NvtxExportTableCallbacks;
typedef const void* (*NvtxGetExportTableFunc_t)(uint32_t exportTableId);

enum { ETID_CALLBACKS = 1, MODULE_CORE2 = 5 };
enum { CB_DomainMarkEx = 1, CB_DomainRangePushEx = 4, CB_DomainRangePop = 5, CB_DomainRegisterStringA = 10,
       CB_DomainCreateA = 12 };
enum { MSG_ASCII = 1, MSG_REGISTERED = 3 };

typedef struct {
  uint16_t version;
  uint16_t size;
  uint32_t category;
  int32_t colorType;
  uint32_t color;
  int32_t payloadType;
  int32_t reserved0;
  union { uint64_t ullValue; int64_t llValue; double dValue; } payload;
  int32_t messageType;
  union { const char* ascii; const void* unicode; const char* registered; } message;
} Attr;

typedef struct { char name[256]; } Named; /* our domain and string handles point at these */

static FILE* out;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void emit(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void emit(const char* fmt, ...) {
  pthread_mutex_lock(&mu);
  if (out) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
    fflush(out);
  }
  pthread_mutex_unlock(&mu);
}

static Named* named(const char* s) {
  Named* n = (Named*)calloc(1, sizeof(Named));
  strncpy(n->name, s ? s : "(null)", sizeof(n->name) - 1);
  return n;
}

static const char* msg(const Attr* a) {
  if (!a) return "(noattr)";
  if (a->messageType == MSG_REGISTERED) return a->message.registered ? ((const Named*)a->message.registered)->name : "(nullreg)";
  if (a->messageType == MSG_ASCII) return a->message.ascii;
  return "(othermsg)";
}
static long tid(void) { return (long)syscall(SYS_gettid); }
static const char* dom(const void* d) { return d ? ((const Named*)d)->name : "(default)"; }

static void* cb_create(const char* name) {
  emit("domain %s", name);
  return named(name);
}
static void* cb_register(const void* d, const char* s) {
  emit("register %s %s", dom(d), s);
  return named(s);
}
static int cb_push(const void* d, const Attr* a) {
  emit("push %ld %s %s %d %lld", tid(), dom(d), msg(a), a ? a->payloadType : -1, a ? (long long)a->payload.llValue : 0LL);
  return 0;
}
static int cb_pop(const void* d) {
  emit("pop %ld %s", tid(), dom(d));
  return 0;
}
static void cb_mark(const void* d, const Attr* a) {
  emit("mark %ld %s %s %d %lld", tid(), dom(d), msg(a), a ? a->payloadType : -1, a ? (long long)a->payload.llValue : 0LL);
}

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable) {
  const char* path = getenv("MAXINSTR_TEST_NVTX_LOG");
  out = path ? fopen(path, "a") : stderr;
  const NvtxExportTableCallbacks* etbl = (const NvtxExportTableCallbacks*)getExportTable(ETID_CALLBACKS);
  if (!etbl || etbl->struct_size < sizeof(NvtxExportTableCallbacks)) return 0;
  NvtxFunctionTable table = 0;
  unsigned int size = 0;
  if (!etbl->GetModuleFunctionTable(MODULE_CORE2, &table, &size) || !table) return 0;
  if (size <= CB_DomainCreateA) return 0;
  *table[CB_DomainCreateA] = (NvtxFunctionPointer)cb_create;
  *table[CB_DomainRegisterStringA] = (NvtxFunctionPointer)cb_register;
  *table[CB_DomainRangePushEx] = (NvtxFunctionPointer)cb_push;
  *table[CB_DomainRangePop] = (NvtxFunctionPointer)cb_pop;
  *table[CB_DomainMarkEx] = (NvtxFunctionPointer)cb_mark;
  emit("init");
  return 1;
}
