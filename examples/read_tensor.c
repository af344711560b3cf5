/*
 * Reading a raw float32 tensor from an stfs mount in C, with pread(2) at explicit offsets.
 *
 *   cc -O2 -o read_tensor examples/read_tensor.c
 *   ./read_tensor /mnt/model/lm_head.weight [FIRST [COUNT]]
 *
 * The file is the tensor's bytes exactly as stored: little-endian, row-major, no header. Its size
 * (fstat) is the element count times 4. pread reads any range without seeking, so several threads
 * could share one descriptor. Prints the size, the element count, the sum of all elements and the
 * elements FIRST..FIRST+COUNT-1 (default 0 and 4).
 *
 * Only float32 is summed: the tensor's dtype and shape come from the mount's extended attributes
 * user.safetensors.dtype and user.safetensors.shape (metadata.json's `dtype` and `shape`). The file
 * is float32 if the dtype is F32, or if it is a float type served converted by `--as f32`; either
 * way its size must be 4 bytes per element. Anything else (BF16, integers, a .npy view with its
 * header, a file off the mount) is refused with exit status 1 rather than summed into nonsense.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

/* Large reads: the mount serves them from whole cached blocks. A multiple of 4, so no float is split. */
#define CHUNK (1 << 20)

/* Reads exactly len bytes at offset; pread may return less than asked (or be interrupted). */
static int read_exact_at(int fd, unsigned char *buf, size_t len, off_t offset) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, buf + done, len - done, offset + (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0) {
            errno = EIO; /* the file ended early */
            return -1;
        }
        done += (size_t)n;
    }
    return 0;
}

/* Decodes a little-endian float32 whatever the host's byte order. */
static float float_le(const unsigned char *p) {
    uint32_t bits = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Reads a text extended attribute into buf (NUL-terminated); -1 with errno set if absent. */
static int text_xattr(const char *path, const char *name, char *buf, size_t size) {
    ssize_t n = getxattr(path, name, buf, size - 1);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    return 0;
}

/* The element count of a shape such as "[2,3]" ("[]" is a scalar: 1); -1 if it does not parse. */
static long long elements_of(const char *shape) {
    long long n = 1;
    const char *p = shape;
    if (*p++ != '[')
        return -1;
    while (*p && *p != ']') {
        char *end;
        long long dim = strtoll(p, &end, 10);
        if (end == p || dim < 0)
            return -1;
        n *= dim;
        p = *end == ',' ? end + 1 : end;
    }
    return *p == ']' ? n : -1;
}

/* Whether `--as f32` serves this dtype converted to float32 (the float types other than F32). */
static int converted_by_as_f32(const char *dtype) {
    static const char *floats[] = {"BF16", "F16", "F64", "F4", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"};
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++)
        if (strcmp(dtype, floats[i]) == 0)
            return 1;
    return 0;
}

/* Refuses (message, 0) a file that is not float32 data; 1 if it is. */
static int check_float32(const char *path, long long size) {
    char dtype[64], shape[4096];
    if (text_xattr(path, "user.safetensors.dtype", dtype, sizeof dtype) != 0 ||
        text_xattr(path, "user.safetensors.shape", shape, sizeof shape) != 0) {
        fprintf(stderr, "%s: no user.safetensors.dtype/shape attributes (%s): not a tensor file of an stfs mount\n",
                path, strerror(errno));
        return 0;
    }
    long long elements = elements_of(shape);
    if (elements < 0 || (strcmp(dtype, "F32") != 0 && !converted_by_as_f32(dtype)) || size != 4 * elements) {
        fprintf(stderr, "%s: dtype %s, shape %s, %lld bytes: not float32 data (only F32 tensors, or floats under --as f32)\n",
                path, dtype, shape, size);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: %s TENSOR_FILE [FIRST [COUNT]]\n", argv[0]);
        return 2;
    }
    long long first = argc > 2 ? atoll(argv[2]) : 0;
    long long count = argc > 3 ? atoll(argv[3]) : 4;
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror(argv[1]);
        return 1;
    }
    if (!check_float32(argv[1], (long long)st.st_size))
        return 1;
    long long elements = st.st_size / 4;
    unsigned char *buf = malloc(CHUNK);
    if (!buf) {
        perror("malloc");
        return 1;
    }
    double sum = 0;
    for (off_t offset = 0; offset < st.st_size; offset += CHUNK) {
        size_t len = st.st_size - offset < CHUNK ? (size_t)(st.st_size - offset) : CHUNK;
        if (read_exact_at(fd, buf, len, offset) != 0) {
            fprintf(stderr, "%s: reading at %lld: %s\n", argv[1], (long long)offset, strerror(errno));
            return 1;
        }
        for (size_t i = 0; i < len; i += 4)
            sum += float_le(buf + i);
    }
    printf("%s: %lld bytes, %lld float32, sum=%.17g\n", argv[1], (long long)st.st_size, elements, sum);
    printf("elements %lld..:", first);
    for (long long i = first; i < first + count && i >= 0 && i < elements; i++) {
        unsigned char one[4];
        if (read_exact_at(fd, one, 4, (off_t)(i * 4)) != 0) {
            fprintf(stderr, "%s: reading element %lld: %s\n", argv[1], i, strerror(errno));
            return 1;
        }
        printf(" %.9g", float_le(one));
    }
    printf("\n");
    free(buf);
    close(fd);
    return 0;
}
