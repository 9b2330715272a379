#include "textflag.h"

// func Int80(nr uint32) int32
TEXT ·Int80(SB), NOSPLIT, $0-12
	MOVL nr+0(FP), AX
	INT  $0x80
	MOVL AX, ret+8(FP)
	RET
