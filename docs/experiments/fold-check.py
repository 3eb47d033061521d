"""Host model of plan_call's fold (src/attention.c): the split plan of a fused per-head decode and
the kernels' fk_block_tokens (src/attention_gpu.c), written out again in Python.  Where folding
the last split of each row into its tail block saves a wave of KIVI_FAST_WAVE resident blocks,
the tail block starts at nf fs.  For random row sets it checks that every token of every row
lies in exactly one block, that the tail block's quantized key groups and values start where the
formulas need them (whole groups, nothing negative), and that no block holds more than
KIVI_FAST_LOGITS tokens (the kernel's logits).  Then it prints the plans of some shapes.
Run: python3 docs/experiments/fold-check.py"""
import random
GRAIN=32; FSPLIT=4096; LOGITS=FSPLIT+256
def plan(Lcs, R, HQ, WAVE=4*132):
    begs=[(Lc-R)//GRAIN*GRAIN if Lc>R else 0 for Lc in Lcs]
    maxbeg=max(begs); rows=len(Lcs)
    fs=FSPLIT
    while fs > 512 and rows*HQ*((maxbeg+fs-1)//fs) < 264: fs//=2
    nf=(maxbeg+fs-1)//fs; nb=rows*HQ
    fold = nf>0 and fs+R+GRAIN<=LOGITS and (nb*(nf+1)+WAVE-1)//WAVE > (nb*nf+WAVE-1)//WAVE
    if fold:
        nf-=1; begs=[min(b, nf*fs) for b in begs]
    return fs,nf,begs,fold
def blocks(Lc, Lf, fs, nf, R):
    Rm=R-1; out=[]
    for sf in range(nf+1):
        if sf==nf:
            Lk=Lc-(Lc&Rm); Lv=Lc-Rm-1 if Lc>Rm+1 else 0
            t0=Lf; n=Lc-Lf; ngq=(Lk-Lf)//32; nvq=Lv-Lf
            assert (Lk-Lf)%32==0 and ngq>=0 and nvq>=0, (Lc,Lf,Lk,Lv)
        else:
            t0=sf*fs; n=min(Lf-t0, fs); ngq=n//32; nvq=n
        if n>0: out.append((t0,n,ngq,nvq))
    return out
random.seed(1); worst=0; cnt=0; single=0
for it in range(20000):
    R=random.choice([32,64,128,256,512]); rows=random.randint(1,8); HQ=random.choice([1,4,32,64])
    Lcs=[random.choice([random.randint(1,300), random.randint(1,5000), random.randint(1,40000)]) for _ in range(rows)]
    fs,nf,begs,fold=plan(Lcs,R,HQ)
    cnt+=fold; single+=fold and nf==0
    for Lc,Lf in zip(Lcs,begs):
        cov=[0]*Lc
        for (t0,n,ngq,nvq) in blocks(Lc,Lf,fs,nf,R):
            assert n<=LOGITS, (n,fs,R)
            worst=max(worst,n)
            for t in range(t0,t0+n): cov[t]+=1
        assert all(c==1 for c in cov), (Lc,Lf,fs,nf,R)
print("ok", "folded plans", cnt, "of them one block per (row, head)", single, "largest block", worst)
for Lc,B in [(4096,1),(8192,1),(16384,1),(32768,1),(4096,2),(4096,4),(4096,8),(32768,8),(4096,16),(4096,32)]:
    fs,nf,begs,fold=plan([Lc]*B,128,32); print(B,Lc,"fs",fs,"nf",nf,"fold",fold,"blocks",B*32*(nf+1))
# test_attention decode_single_block_rows: 9 rows x 32 query heads
L=[4200,700,1500,3000,150,2500,4000,900,3500]; fs,nf,begs,fold=plan(L,128,32)
print("decode_single_block_rows: fs",fs,"nf",nf,"fold",fold,"largest block",max(n for Lc,Lf in zip(L,begs) for (_,n,_,_) in blocks(Lc,Lf,fs,nf,128)))
