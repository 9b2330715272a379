/* lockadd: ns per lock xadd, plain add and lock cmpxchg on one hot line, in a loop (cc -O2 -o lockadd lockadd.c; taskset -c 0 ./lockadd). */
#include <stdio.h>
#include <time.h>
#include <stdint.h>
static uint64_t now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000ull+t.tv_nsec;}
int main(){ volatile uint64_t x=0; uint64_t n=50000000, t0=now();
 for(uint64_t i=0;i<n;i++) __sync_fetch_and_add(&x,1);
 uint64_t t1=now(); for(uint64_t i=0;i<n;i++) x+=1; uint64_t t2=now();
 uint64_t y=0; for(uint64_t i=0;i<n;i++) __sync_val_compare_and_swap(&x,x,x+1); uint64_t t3=now();
 printf("lock add %.2f ns, plain add %.2f ns, cas %.2f ns\n",(t1-t0)/(double)n,(t2-t1)/(double)n,(t3-t2)/(double)n);}
